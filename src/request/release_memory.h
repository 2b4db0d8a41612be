// Returning memory after a large request, for the worker and the router alike.
#pragma once

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstddef>

namespace strata {

// After a request of at least kLargeRequestBytes, on a worker thread: returns the pages
// the allocator holds free to the system (glibc's malloc_trim, a few milliseconds). The
// causes of growth are fixed where memory is taken (the tokenizer streams its pieces and
// frees a long word's scratch; blocks of 4 MiB and more are mapped and unmapped, see
// `strata serve`); this is the complement for the smaller blocks that parsing, rendering
// and tokenizing a large body leave scattered in the worker threads' arenas.
inline constexpr size_t kLargeRequestBytes = size_t{1} << 20;
inline void release_memory_after(size_t request_bytes) {
#ifdef __GLIBC__
  if (request_bytes >= kLargeRequestBytes) malloc_trim(0);
#else
  (void)request_bytes;
#endif
}

// glibc's malloc serves a block of at least M_MMAP_THRESHOLD with a mapping of its own,
// unmapped when the block is freed; smaller blocks come from arenas (one per thread, up
// to 8 per core) that keep freed memory for reuse, and give back only what is free at an
// arena's top beyond M_TRIM_THRESHOLD (malloc_trim does not trim the top of a thread's
// arena). By default both thresholds rise with the largest mapped block freed (up to 32
// and 64 MiB), so after one 10 MB request the next ones' buffers land in the worker
// threads' arenas and stay there: measured, 30 to 70 MB more per 10 MB /tokenize until
// every worker's arena is full. Fixed thresholds keep large blocks mapped and arena tops
// short. 4 MiB is above the per-token scratch of the sampler (a vocabulary of up to 512 K
// entries at 8 bytes), and the forward pass reuses its buffers, so decoding does not map
// and unmap per token. Called once at start-up by `strata serve` and `strata route`.
inline void tune_allocator() {
#ifdef __GLIBC__
  constexpr int kThresholdBytes = 4 << 20;
  mallopt(M_MMAP_THRESHOLD, kThresholdBytes);
  mallopt(M_TRIM_THRESHOLD, kThresholdBytes);
#endif
}

}  // namespace strata
