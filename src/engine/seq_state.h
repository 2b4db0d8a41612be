// Where a request is in the scheduler's hands: one state, the container it lives in, and the
// table of the moves between states (docs/scheduling.md, "A request's states"). Internal to
// the engine: the scheduler changes a request's state only through Scheduler::Seq::move_to,
// which checks the move against `seq_transition_allowed`, and audit_pages checks that every
// request sits in the container of its state.
#pragma once

#include <cstdint>

namespace strata {

enum class SeqState : uint8_t {
  // waiting_: no pages of its own (a prefix it loaded back may be held by load_receipt).
  kWaiting,
  // parked_: waits for its prefix to load from the host, or for a prefetch from storage.
  kParked,
  // remote_ (decode side of P/D): its cached prefix locked, pages reserved for the rest of
  // the prompt, which a prefill worker computes.
  kOrdered,
  // remote_: the prefill worker is done; the room's pages are being received.
  kReceiving,
  // running_: pages and locks; prefilling or decoding (Seq::decoding() tells which: the
  // difference is one token per step and changes every step, so it is not a state).
  kRunning,
  // pd_sending_ (prefill side of P/D): the order's prompt is computed; its last pages are
  // on their way to the decode worker.
  kSending,
  // Ended: the stream has its last item (or the order ended); no pages, no locks.
  kFinished,
};

constexpr const char* seq_state_name(SeqState s) {
  switch (s) {
    case SeqState::kWaiting:
      return "waiting";
    case SeqState::kParked:
      return "parked";
    case SeqState::kOrdered:
      return "ordered";
    case SeqState::kReceiving:
      return "receiving";
    case SeqState::kRunning:
      return "running";
    case SeqState::kSending:
      return "sending";
    case SeqState::kFinished:
      return "finished";
  }
  return "?";
}

// Whether a request in state `s` holds device pages or tree locks of its own (its prefix
// lock, pages it computed or reserved): what it gives back when it leaves the state.
constexpr bool seq_holds_pages(SeqState s) {
  return s == SeqState::kOrdered || s == SeqState::kReceiving || s == SeqState::kRunning ||
         s == SeqState::kSending;
}

// The moves a request may make. Every state may end (kFinished): cancellation, shutdown, an
// error, an aborted order. Besides:
//   waiting   -> running    admitted (its prefix locked, pages for the rest found)
//   waiting   -> parked     its prefix is on the host (a load) or in storage (a prefetch)
//   waiting   -> ordered    its prompt is ordered from a prefill worker
//   parked    -> waiting    the load or prefetch landed, or its deadline passed
//   ordered   -> receiving  the prefill worker is done
//   ordered   -> waiting    the room failed: it prefills locally
//   receiving -> running    the pages landed; it decodes from the first token
//   receiving -> waiting    the receive failed: it prefills locally
//   running   -> waiting    retracted or preempted (its computed pages stay in the tree)
//   running   -> sending    an order's prompt is computed (prefill side)
constexpr bool seq_transition_allowed(SeqState from, SeqState to) {
  using S = SeqState;
  if (from == S::kFinished) return false;
  if (to == S::kFinished) return true;
  switch (from) {
    case S::kWaiting:
      return to == S::kRunning || to == S::kParked || to == S::kOrdered;
    case S::kParked:
      return to == S::kWaiting;
    case S::kOrdered:
      return to == S::kReceiving || to == S::kWaiting;
    case S::kReceiving:
      return to == S::kRunning || to == S::kWaiting;
    case S::kRunning:
      return to == S::kWaiting || to == S::kSending;
    case S::kSending:
    case S::kFinished:
      return false;
  }
  return false;
}

}  // namespace strata
