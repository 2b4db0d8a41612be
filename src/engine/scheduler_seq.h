// The scheduler's records of a request (Scheduler::Seq) and of a prefill order being
// computed for a decode worker (Scheduler::RemoteOrder). Internal to the engine: shared
// by scheduler.cc and scheduler_pd.cc only.
#pragma once

#include <functional>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "common/check.h"
#include "engine/scheduler.h"
#include "engine/seq_state.h"

namespace strata {

// A request inside the scheduler. Page ownership: pages[0, tree_pages) belong to the
// tree and are protected by `receipt`; pages[tree_pages, end) belong to this request.
// Its lifecycle is `state` alone (engine/seq_state.h); the flags below are not states: they
// record what was tried or counted once, whichever state the request is in.
struct Scheduler::Seq {
  uint64_t id = 0;
  SeqState state = SeqState::kWaiting;
  RequestSpec spec;
  std::shared_ptr<RequestStream> stream;
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t prompt_len = 0;       // the original prompt (usage)
  int64_t computed = 0;         // tokens whose KV is in pages
  std::vector<PageId> pages;
  int32_t tree_pages = 0;
  LockReceipt receipt;
  // Prompt and cache hits counted at the first admission; a retracted request keeps the
  // figures the client saw, whatever state it goes through after.
  bool counted = false;
  int32_t generated = 0;
  RequestUsage usage;
  std::optional<Sampler> sampler;
  // The next token's draw (Sampler::next_row), taken when a batch first asked a model to
  // sample this row (ForwardSequence::sampling) and kept until a token uses it: a row made
  // void and computed again draws with the same number, wherever it is sampled.
  std::optional<RowSampling> draw;
  // Overlapped steps: the draw of the token after that, taken when the next batch was
  // prepared before this one's token was read (it becomes `draw` once `draw` is used); the
  // id of the last batch this request has a row in (Scheduler::Batch::id); and how it ended
  // when it ended in a batch that another batch holding it followed: it finishes once that
  // one has run (its pages are that batch's until then), the row it has there void.
  std::optional<RowSampling> next_draw;
  uint64_t last_batch = 0;
  struct Ending {
    FinishReason reason = FinishReason::kStop;
    int32_t stop_token = -1;
  };
  std::optional<Ending> ending;
  // Hierarchical cache: tiers tried for this request, and what they gave. (A try is made
  // once per turn in the queue and reset where trying again makes sense: not a state.)
  bool load_tried = false;
  bool prefetch_tried = false;
  LockReceipt load_receipt;  // holds a host path while it loads to the device (parked)
  // A load-back overlapped with the prefill (LoadOverlap::kLayer): the request runs while
  // pages[0, tree_pages) land. The load's ticket until it is settled (0: none), the wait its
  // forward pass calls per layer (while the pass runs), and whether the copy failed or
  // stalled (then what it computed over those pages is void: it steps back).
  TransferTicket load_ticket = 0;
  LayerWait layer_wait;
  bool load_failed = false;
  bool waited_shared = false;    // waited for a running request's prefill (counted once)
  int64_t park_deadline_ms = 0;  // parked for a prefetch: stop waiting then (0: never)
  int32_t host_tokens = 0;       // prompt tokens loaded back from the host
  int32_t storage_tokens = 0;    // of which first read from storage
  // Scheduling (queue_order.h): set when the request reaches the scheduler thread.
  SchedClass cls = SchedClass::kNormal;
  int64_t arrival_ms = 0;
  // Disaggregation, decode side: a room was tried (once per request, like the tiers'
  // tries), the room this request's prompt is computed in (kOrdered, kReceiving; 0: none),
  // since when, and the first token the prefill worker sampled.
  bool pd_tried = false;
  uint64_t pd_room = 0;
  int64_t pd_ordered_ms = 0;
  int32_t pd_first_token = -1;
  // With a stage (engine/pd_stage.h): the stage pages the prefill worker writes the room's
  // KV into, held from the order until they are copied to the room's device pages.
  std::vector<PageId> pd_stage_pages;
  // Prefill side: the room of the order this request computes (0: an ordinary request).
  uint64_t remote_room = 0;

  // The one way to change state: the move must be in seq_transition_allowed's table.
  void move_to(SeqState to) {
    STRATA_CHECK_MSG(
        seq_transition_allowed(state, to),
        std::string("request moved from ") + seq_state_name(state) + " to " + seq_state_name(to));
    state = to;
  }
  bool holds_pages() const { return seq_holds_pages(state); }
  // Prefill or decode (kRunning): one token left to compute is a decode step.
  bool decoding() const { return static_cast<int64_t>(tokens.size()) - computed == 1; }
};

// A caller of tool_session(): tool_start, or tool_end (`start` false), until its move landed.
struct Scheduler::SessionWaiter {
  std::string id;
  bool start = false;
  uint64_t epoch = 0;        // tool_end's
  bool begun = false;        // the session accepted the move; waiting for its copies
  int64_t moved_tokens = 0;  // what the move reported when it began
  int64_t deadline_ms = 0;   // stop waiting (for room, then for the copies) then
  std::promise<Result<ToolSessionView>> promise;
  std::function<void()> on_ready;
};

// Prefill side: one order being computed and sent (docs/pd-disaggregation.md).
struct Scheduler::RemoteOrder {
  enum class State : uint8_t { kComputing, kSending, kAborted };
  State state = State::kComputing;
  std::string peer;  // the decode worker
  PageDestinationId destination{};
  int32_t first_page = 0;  // the prompt page that dst_pages[0] receives
  int32_t prompt_len = 0;
  std::vector<PageId> dst_pages;
  int32_t pages_sent = 0;   // dst_pages[0, pages_sent) handed to the transport
  int32_t outstanding = 0;  // sends not completed
  bool send_failed = false;
  // Protects the sent full pages (in the tree) while the transport may read them: the
  // request itself may be retracted or end meanwhile.
  LockReceipt send_receipt;
  int64_t received_ms = 0;
  int64_t last_keepalive_ms = 0;
  uint64_t bytes = 0;
  int32_t first_token = -1;
  bool tell_peer = true;  // aborted: send PrefillFailed (not when the peer is dead)
  std::string why;
};

}  // namespace strata
