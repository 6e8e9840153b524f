/* The C functions libtide_preload.so exports besides the CUDA hooks: what tide's Python layer
 * (and the tests) use to read the interposer's numbers and to mark phases. Find them with
 * dlsym(RTLD_DEFAULT, ...): they exist only in processes running under the preload. */
#ifndef TIDE_INTERPOSE_PRELOAD_API_H_
#define TIDE_INTERPOSE_PRELOAD_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tide_interpose_stats {
  uint64_t live_bytes;          /* device memory held now through hooked calls */
  uint64_t peak_bytes;          /* the most held at once */
  uint64_t phase_peak_bytes[4]; /* unmarked, forward, backward, update */
  uint64_t allocations;         /* all devices */
  uint64_t frees;
  uint64_t limit_bytes;      /* TIDE_MEMORY_LIMIT, 0 when none */
  uint64_t limit_used_bytes; /* what the limit counts on this device */
  uint64_t limit_rejections;
  uint64_t runtime_allocations;      /* allocations made by a runtime call (cudaMalloc, ...) */
  uint64_t runtime_fallback_records; /* ... that the runtime hook had to record itself */
};

/* The numbers for `device`. Returns 0, or -1 when `out` is null or no hooked CUDA call has
 * happened yet in this process (the preload is still inert). */
int tide_interpose_read_stats(int device, struct tide_interpose_stats* out);

/* Marks the start of a phase: "forward", "backward" or "update". Returns 0, or -1 for another
 * name. */
int tide_interpose_mark_phase(const char* phase);

/* Writes the report (and its trace, next to it) now. Returns 0, or -1 (message on stderr). */
int tide_interpose_write_report(const char* path);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_INTERPOSE_PRELOAD_API_H_ */
