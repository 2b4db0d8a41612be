// The cache-control commands: each posts one function to the scheduler thread and turns
// the tree's, the pools' and the tool sessions' answers into the public value types.
#include "engine/cache_control.h"

#include "engine/page_math.h"
#include "engine/pin_policy.h"
#include "engine/scheduler.h"

namespace strata {
namespace {

CacheState read_state(const EngineState& s, const StateQuery& query) {
  CacheState out;
  out.tree = s.tree.stats();
  out.engine = s.counters;
  // Host pages have the device pool's shape (host_kv_pool.h).
  const auto page_bytes = static_cast<int64_t>(s.kv_pool.page_bytes());
  out.kv_dtype = std::string(kv_dtype_name(s.kv_pool.dtype()));
  out.device = CacheState::Pool{.capacity_pages = s.device_pages.num_pages(),
                                .free_pages = s.device_pages.num_free(),
                                .used_pages = s.device_pages.num_allocated(),
                                .page_bytes = page_bytes};
  out.request_pages = s.request_private_pages;
  if (s.host_pages != nullptr) {
    out.host = CacheState::Host{
        .pool = CacheState::Pool{.capacity_pages = s.host_pages->num_pages(),
                                 .free_pages = s.host_pages->num_free(),
                                 .used_pages = s.host_pages->num_allocated(),
                                 .page_bytes = page_bytes},
        .write_policy = std::string(write_policy_name(s.options.hicache.write_policy)),
        .mem_layout = std::string(host_layout_name(s.options.hicache.layout))};
  }
  if (s.storage != nullptr) {
    const StorageStats st = s.storage->stats();
    out.storage = CacheState::Storage{.backend = std::string(s.storage->name()),
                                      .get_hits = st.get_hits,
                                      .get_misses = st.get_misses,
                                      .get_errors = st.get_errors,
                                      .corrupt_values = st.corrupt_values,
                                      .set_written = st.set_written,
                                      .set_skipped_existing = st.set_skipped_existing,
                                      .set_errors = st.set_errors,
                                      .bytes_read = st.bytes_read,
                                      .bytes_written = st.bytes_written,
                                      .foreign_format_values = st.foreign_format_values};
  }
  if (query.with_tree) out.nodes = s.tree.snapshot();
  return out;
}

}  // namespace

std::future<Result<PinOutcome>> CacheControl::pin(PinCommand command) {
  return scheduler_.call([c = std::move(command)](EngineState& s) { return apply_pin(s, c); });
}

std::future<Result<UnpinOutcome>> CacheControl::unpin(std::vector<BlockHash> hashes) {
  return scheduler_.call(
      [h = std::move(hashes)](EngineState& s) -> Result<UnpinOutcome> { return s.tree.unpin(h); });
}

std::future<Result<EvictBlocksOutcome>> CacheControl::evict_blocks(EvictBlocksCommand command) {
  return scheduler_.call([c = std::move(command)](EngineState& s) -> Result<EvictBlocksOutcome> {
    return s.tree.evict_blocks(c.hashes, c.descendants);
  });
}

std::future<Result<EvictLruOutcome>> CacheControl::evict_lru(int64_t pages) {
  return scheduler_.call([pages](EngineState& s) -> Result<EvictLruOutcome> {
    if (pages < 0) return make_error(ErrorCode::kInvalidArgument, "pages must be >= 0");
    const auto n = static_cast<int32_t>(std::min<int64_t>(pages, INT32_MAX));
    const EvictResult r = s.tree.evict(n, EvictReason::kOperator);
    return EvictLruOutcome{.evicted_pages = r.evicted_pages, .pending_pages = r.pending_pages};
  });
}

std::future<Result<FlushOutcome>> CacheControl::flush() {
  return scheduler_.call([](EngineState& s) -> Result<FlushOutcome> { return s.tree.flush(); });
}

std::future<Result<CacheState>> CacheControl::state(StateQuery query) {
  return scheduler_.call(
      [query](EngineState& s) -> Result<CacheState> { return read_state(s, query); });
}

std::future<Result<CacheNodeContent>> CacheControl::node(uint64_t id) {
  return scheduler_.call([id](EngineState& s) -> Result<CacheNodeContent> {
    const RadixNode* n = s.tree.find_node(id);
    if (n == nullptr) {
      return make_error(ErrorCode::kNotFound, "no cached node has id " + std::to_string(id));
    }
    return CacheNodeContent{.node = s.tree.snapshot_of(*n), .token_ids = n->tokens};
  });
}

std::future<Result<ToolSessionView>> CacheControl::tool_start(std::string session_id,
                                                              std::function<void()> on_ready) {
  return scheduler_.tool_session(std::move(session_id), std::nullopt, std::move(on_ready));
}

std::future<Result<ToolSessionView>> CacheControl::tool_end(std::string session_id, uint64_t epoch,
                                                            std::function<void()> on_ready) {
  return scheduler_.tool_session(std::move(session_id), epoch, std::move(on_ready));
}

std::future<Result<ToolSessionView>> CacheControl::kv_meta(std::string session_id) {
  return scheduler_.call(
      [id = std::move(session_id)](EngineState& s) { return s.sessions->kv_meta(id); });
}

}  // namespace strata
