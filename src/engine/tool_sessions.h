// Tool-call sessions: an agent's conversation whose KV is moved to the host while the
// agent waits for a tool, and brought back when the tool answers (docs/tool-sessions.md).
//
// A session is named by the requests' session_id. The engine records, when a request of
// the session finishes, the exact tokens whose KV is cached (prompt + generated) and the
// block hash of the last full page. It never keeps a node pointer across scheduler steps:
// nodes split and leave the tree, block hashes do not change, and the hash index finds
// the node at any time. tool_start protects the path on the host (host_ref on the node
// ending exactly at that block, so later splits keep it the deepest protected node) and
// moves it off the device; tool_end loads it back, all or nothing, and drops the
// protection. Each tool_start bumps an epoch that tool_end must echo.
//
// States: RUNNABLE -> (tool_start) OFFLOADING -> OFFLOADED -> (tool_end) RESTORING ->
// RUNNABLE. A request of the session, a failed restore (protection released, state
// OFFLOADED: a later tool_end or request recovers), or the TTL also release the host copy.
//
// Thread: the scheduler thread only (it owns the tree); other threads reach it through
// the cache-control commands (engine/cache_control.h).
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/radix_tree.h"
#include "common/clock.h"
#include "common/result.h"
#include "engine/cache_control.h"

namespace strata {

class ToolSessions {
 public:
  // `ttl_ms`: an offloaded session without tool_end is released after it. Records of
  // sessions that hold nothing (RUNNABLE, no request running) are kept at most
  // `max_idle_records` (least recently used dropped) and at most `idle_ttl_ms`.
  // `resume_hold_ms`: a restored session's device copy stays locked until its next
  // request arrives, at most this long.
  ToolSessions(RadixTree& tree, const Clock& clock, int64_t ttl_ms, int64_t max_idle_records,
               int64_t idle_ttl_ms, int64_t resume_hold_ms = 10'000);

  // A request of the session arrived: an offloaded session comes back with it. True when
  // the request resumes the session (the first since tool_end, or it brings the session
  // back itself): the scheduler serves it first (engine/queue_order.h, kResume).
  bool on_request_arrived(const std::string& id);
  // A request of the session ended; `tokens` have their KV in the tree.
  void on_request_finished(const std::string& id, std::span<const int32_t> tokens,
                           const std::string& cache_salt);

  Result<ToolSessionView> tool_start(const std::string& id);
  // Starts the load-back (the engine submits the copies after the call).
  Result<ToolSessionView> tool_end(const std::string& id, uint64_t epoch);
  Result<ToolSessionView> kv_meta(const std::string& id) const;

  // Advances OFFLOADING -> OFFLOADED and RESTORING -> RUNNABLE as copies land, and
  // releases sessions past the TTL. Returns the sessions released by the TTL.
  int32_t tick();
  // Sessions by state, indexed by ToolSessionState (O(sessions not RUNNABLE)).
  std::array<int64_t, 4> count_by_state() const;
  uint64_t dropped_total() const { return dropped_total_; }
  // Whether a restoring or just-restored session holds device pages: such holds end by
  // themselves (the restore lands; the next turn arrives or resume_hold_ms passes), so
  // the no-deadlock rule waits for them instead of failing a request.
  bool holds_device() const;

 private:
  struct Session {
    std::string id;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recently used)
    int64_t used_ms = 0;                   // engine clock: last request or call
    ToolSessionState state = ToolSessionState::kRunnable;
    uint64_t epoch = 0;
    int64_t tokens = 0;
    std::vector<int32_t> token_ids;  // full pages only
    std::string salt;
    BlockHash last_hash = 0;
    bool has_kv = false;          // at least one full page
    bool protected_ = false;      // host_ref taken on the node ending at last_hash
    LockReceipt restore_lock;     // held while RESTORING
    int32_t running = 0;          // requests of the session in the engine
    bool resume_pending = false;  // restored by tool_end; its next request resumes it
    int64_t hold_until_ms = 0;    // RUNNABLE with restore_lock: the device hold ends then
    int64_t since_ms = 0;         // wall clock
    int64_t changed_ms = 0;       // engine clock (TTL)
  };
  // The session's record, created when new, marked used.
  Session& touch(const std::string& id);
  // A record that holds nothing may be dropped.
  static bool droppable(const Session& s);
  // Drops records beyond the cap and idle past the TTL (least recently used first).
  void trim();
  void set_state(Session& s, ToolSessionState state);
  void release(Session& s);    // drops protection and restore lock
  void drop_hold(Session& s);  // a restored session's device lock, if any
  // RESTORING -> RUNNABLE (held) once all on the device; -> OFFLOADED when a copy of the
  // restore failed.
  void settle_restore(Session& s);
  std::string tier_of(const Session& s) const;
  bool path_all(const Session& s, bool on_device) const;
  // Whether a node of the session's path has a host -> device copy in flight.
  bool path_loading(const Session& s) const;
  ToolSessionView view(const Session& s) const;

  RadixTree& tree_;
  const Clock& clock_;
  int64_t ttl_ms_;
  int64_t max_idle_records_;
  int64_t idle_ttl_ms_;
  std::unordered_map<std::string, Session> sessions_;
  std::list<std::string> lru_;                    // every session id, most recently used first
  std::unordered_set<std::string> not_runnable_;  // ids in a state tick() must advance
  std::unordered_set<std::string> held_;          // RUNNABLE ids whose device copy is held
  int64_t resume_hold_ms_;
  uint64_t dropped_total_ = 0;
};

}  // namespace strata
