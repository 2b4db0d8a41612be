// The cache-control commands: each posts one function to the scheduler thread and turns
// the tree's, the pools' and the tool sessions' answers into the public value types.
#include "engine/cache_control.h"

#include "engine/page_math.h"
#include "engine/pin_policy.h"
#include "engine/scheduler.h"

namespace strata {
namespace {

CacheState::Node node_view(const NodeSnapshot& n) {
  return CacheState::Node{.id = n.id,
                          .parent = n.parent_id,
                          .tokens = n.num_tokens,
                          .block_hashes = n.block_hashes,
                          .on_device = n.on_device,
                          .on_host = n.on_host,
                          .in_storage = n.in_storage,
                          .lock_ref = n.lock_ref,
                          .pin_ref = n.pin_ref,
                          .soft_pinned_blocks = n.soft_pinned_blocks,
                          .pin_counts = n.pin_counts,
                          .soft_pin_ttl_ms = n.soft_pin_ttl_ms,
                          .last_access_ms = n.last_access_ms,
                          .hit_count = n.hit_count,
                          .loading = n.loading,
                          .session_protected = n.host_ref > 0,
                          .evictable = n.evictable};
}

CacheState read_state(const EngineState& s, const StateQuery& query) {
  const TreeStats t = s.tree.stats();
  const EngineCounters& c = s.counters;
  CacheState out;
  out.page_size = t.page_size;
  out.device = CacheState::Device{.capacity_pages = s.device_pages.num_pages(),
                                  .free_pages = s.device_pages.num_free(),
                                  .used_pages = s.device_pages.num_allocated(),
                                  .cached_pages = t.cached_pages,
                                  .request_pages = s.request_private_pages,
                                  .pinned_blocks = t.pinned_blocks,
                                  .soft_pinned_blocks = t.soft_pinned_blocks,
                                  .protected_pages = t.protected_pages,
                                  .evictable_pages = t.cached_pages - t.protected_pages,
                                  .locked_nodes = t.locked_nodes};
  if (s.host_pages != nullptr) {
    out.host = CacheState::Host{
        .capacity_pages = s.host_pages->num_pages(),
        .free_pages = s.host_pages->num_free(),
        .used_pages = s.host_pages->num_allocated(),
        .cached_pages = t.host_cached_pages,
        .host_only_pages = t.host_only_pages,
        .protected_pages = t.host_protected_pages,
        .evictable_pages = t.host_evictable_pages,
        .write_policy = std::string(write_policy_name(s.options.hicache.write_policy)),
        .mem_layout = std::string(host_layout_name(s.options.hicache.layout)),
        .transfers_in_flight = t.io_pending_nodes};
  }
  if (s.storage != nullptr) {
    const StorageStats st = s.storage->stats();
    out.storage = CacheState::Storage{.backend = std::string(s.storage->name()),
                                      .stored_pages_known = t.stored_pages,
                                      .pages_written_total = c.storage_pages_written,
                                      .prefetches_total = c.prefetches_started,
                                      .prefetch_pages_read_total = c.prefetch_pages_read,
                                      .prefetch_timeouts_total = c.prefetch_timeouts,
                                      .faults_total = c.storage_faults,
                                      .get_hits = st.get_hits,
                                      .get_misses = st.get_misses,
                                      .get_errors = st.get_errors,
                                      .corrupt_values = st.corrupt_values,
                                      .set_written = st.set_written,
                                      .set_skipped_existing = st.set_skipped_existing,
                                      .set_errors = st.set_errors,
                                      .bytes_read = st.bytes_read,
                                      .bytes_written = st.bytes_written};
  }
  out.nodes_count = t.num_nodes;
  out.hits = CacheState::Hits{
      .match_calls = t.match_calls,
      .matched_tokens_total = t.matched_pages_total * static_cast<uint64_t>(t.page_size),
      .cached_prompt_tokens_total = c.cached_prompt_tokens,
      .cached_host_tokens_total = c.cached_host_tokens,
      .cached_storage_tokens_total = c.cached_storage_tokens,
      .prompt_tokens_total = c.prompt_tokens};
  out.evictions =
      CacheState::Evictions{.evicted_pages_total = t.evicted_pages_total,
                            .demoted_pages_total = t.demoted_pages_total,
                            .host_evicted_pages_total = t.host_evicted_pages_total,
                            .backed_up_pages_total = t.backed_up_pages_total,
                            .loaded_pages_total = t.loaded_pages_total,
                            .backups_skipped_total = t.backups_skipped_total,
                            .loads_failed_total = c.loads_failed,
                            .auto_unpinned_blocks_total = c.auto_unpinned_blocks,
                            .expired_pins_total = t.expired_pins_total,
                            .auto_unpinned_host_blocks_total = c.auto_unpinned_host_blocks};
  out.running_requests = c.running;
  out.waiting_requests = c.waiting;
  if (query.with_tree) {
    std::vector<CacheState::Node> nodes;
    for (const NodeSnapshot& n : s.tree.snapshot()) nodes.push_back(node_view(n));
    out.nodes = std::move(nodes);
  }
  return out;
}

}  // namespace

std::future<Result<PinOutcome>> CacheControl::pin(PinCommand command) {
  return scheduler_.call([c = std::move(command)](EngineState& s) { return apply_pin(s, c); });
}

std::future<Result<UnpinOutcome>> CacheControl::unpin(std::vector<BlockHash> hashes) {
  return scheduler_.call([h = std::move(hashes)](EngineState& s) -> Result<UnpinOutcome> {
    const UnpinResult r = s.tree.unpin(h);
    return UnpinOutcome{.unpinned = r.unpinned, .unknown = r.unknown, .not_pinned = r.not_pinned};
  });
}

std::future<Result<EvictBlocksOutcome>> CacheControl::evict_blocks(EvictBlocksCommand command) {
  return scheduler_.call([c = std::move(command)](EngineState& s) -> Result<EvictBlocksOutcome> {
    const EvictBlocksResult r = s.tree.evict_blocks(c.hashes, c.descendants);
    return EvictBlocksOutcome{.evicted_blocks = r.evicted_blocks,
                              .skipped_locked = r.skipped_locked,
                              .skipped_pinned = r.skipped_pinned,
                              .skipped_has_children = r.skipped_has_children,
                              .unknown = r.unknown};
  });
}

std::future<Result<EvictLruOutcome>> CacheControl::evict_lru(int64_t pages) {
  return scheduler_.call([pages](EngineState& s) -> Result<EvictLruOutcome> {
    if (pages < 0) return make_error(ErrorCode::kInvalidArgument, "pages must be >= 0");
    const auto n = static_cast<int32_t>(std::min<int64_t>(pages, INT32_MAX));
    const EvictResult r = s.tree.evict(n);
    return EvictLruOutcome{.evicted_pages = r.evicted_pages, .pending_pages = r.pending_pages};
  });
}

std::future<Result<FlushOutcome>> CacheControl::flush() {
  return scheduler_.call([](EngineState& s) -> Result<FlushOutcome> {
    const FlushResult r = s.tree.flush();
    return FlushOutcome{.evicted_device_pages = r.evicted_pages,
                        .evicted_host_pages = r.evicted_host_pages,
                        .pinned_preserved = r.pinned_preserved,
                        .locked_skipped = r.locked_skipped};
  });
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
    return CacheNodeContent{.node = node_view(s.tree.snapshot_of(*n)), .token_ids = n->tokens};
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
