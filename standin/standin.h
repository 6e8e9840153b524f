/* Control API of the host stand-in driver, libtide_standin_cuda.so.
 *
 * The stand-in exports the cu* driver functions tide uses, backed by host memory (see
 * standin/README.md for what it simulates and how). These tide_standin_* functions let tests and
 * benchmarks read its statistics, inject faults and change the simulated hardware at run time.
 * Link the library, or find them with dlsym() on the handle that loaded it.
 *
 * Functions returning int return 0 on success, or a CUresult code (e.g. 3,
 * CUDA_ERROR_NOT_INITIALIZED, before cuInit; 1, CUDA_ERROR_INVALID_VALUE, for a bad argument).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TIDE_STANDIN_API __attribute__((visibility("default")))
#else
#define TIDE_STANDIN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Counters since cuInit or the last tide_standin_reset_stats(). Calls are counted when they
 * succeed (an enqueued async copy counts when it is enqueued). New fields go at the end. */
typedef struct tide_standin_stats {
  uint64_t driver_calls;  /* cu* calls, all of them but cuGetErrorName/String and
                             cuGetProcAddress (the calls TIDE_STANDIN_DEVICE_LOST counts) */
  uint64_t device_allocs; /* cuMemAlloc, cuMemAllocAsync */
  uint64_t device_frees;  /* cuMemFree, cuMemFreeAsync */
  uint64_t mem_creates;   /* cuMemCreate */
  uint64_t mem_releases;  /* cuMemRelease */
  uint64_t copies_h2d;    /* sync and async */
  uint64_t copies_d2h;
  uint64_t copies_d2d;
  uint64_t bytes_h2d;
  uint64_t bytes_d2h;
  uint64_t bytes_d2d;
  uint64_t memsets;
  uint64_t pageable_async_copies; /* async copies whose host side was not page-locked */
  uint64_t host_registers;        /* cuMemHostRegister */
  uint64_t host_unregisters;      /* cuMemHostUnregister */
  uint64_t host_allocs;           /* cuMemHostAlloc */
  uint64_t host_frees;            /* cuMemFreeHost */
  uint64_t kernel_launches;
  uint64_t host_funcs;      /* cuLaunchHostFunc */
  uint64_t injected_faults; /* calls failed by TIDE_STANDIN_FAIL_* or the control API */
  /* Gauges (not reset by tide_standin_reset_stats, except the peak, which restarts from now). */
  uint64_t device_bytes_in_use; /* all devices: cuMemAlloc'd plus cuMemCreate'd, not yet freed */
  uint64_t device_bytes_peak;
  uint64_t registered_host_bytes; /* cuMemHostRegister'd, not yet unregistered */
  uint64_t host_alloc_bytes;      /* cuMemHostAlloc'd, not yet freed */
} tide_standin_stats;

TIDE_STANDIN_API void tide_standin_get_stats(tide_standin_stats* out);
/* One field of tide_standin_stats by its name (e.g. "copies_h2d"): for callers through dlsym or
 * ctypes. Returns 0, or CUDA_ERROR_INVALID_VALUE (1) for an unknown name. */
TIDE_STANDIN_API int tide_standin_stat(const char* name, uint64_t* value);
TIDE_STANDIN_API void tide_standin_reset_stats(void);

/* Fault injection, counted from this call: the nth device allocation (cuMemAlloc, cuMemAllocAsync
 * or cuMemCreate) from now fails with CUDA_ERROR_OUT_OF_MEMORY; the nth copy (any direction, sync
 * or async) fails with CUDA_ERROR_LAUNCH_FAILED, returned by the call that would have enqueued
 * it; from the nth driver call on, every call fails with CUDA_ERROR_DEVICE_UNAVAILABLE. n = 1 is
 * the next one; n = 0 disarms (for device_lost: the device is back). These replace what the
 * TIDE_STANDIN_FAIL_ALLOC, _FAIL_COPY and _DEVICE_LOST variables armed at cuInit. */
TIDE_STANDIN_API int tide_standin_fail_alloc(uint64_t n);
TIDE_STANDIN_API int tide_standin_fail_copy(uint64_t n);
TIDE_STANDIN_API int tide_standin_device_lost(uint64_t n);

/* Simulated copy bandwidth in GB/s (1e9 bytes/s) for copies that start from now on; 0 means no
 * simulated limit (memcpy speed). Replaces TIDE_STANDIN_H2D_GBPS and TIDE_STANDIN_D2H_GBPS. */
TIDE_STANDIN_API int tide_standin_set_bandwidth(double h2d_gbps, double d2h_gbps);

/* HMM mode (TIDE_STANDIN_HMM): on = 1, devices may address ordinary pageable host memory, as
 * on systems with HMM or ATS: copies and kernels accept any host pointer outside device memory
 * and reserved VMM ranges as device memory. on = 0: only device allocations and mapped VMM
 * ranges are (the default, a discrete GPU). Callable before cuInit; 1 for any other value. */
TIDE_STANDIN_API int tide_standin_set_hmm(int on);

/* Device memory of one device: bytes in use, peak, capacity (any pointer may be null). */
TIDE_STANDIN_API int tide_standin_device_memory(int device, uint64_t* used, uint64_t* peak,
                                                uint64_t* capacity);
/* Changes one device's capacity (TIDE_STANDIN_MEMORY). Memory already in use stays allocated
 * even above the new capacity; later allocations see the new one. */
TIDE_STANDIN_API int tide_standin_set_capacity(int device, uint64_t bytes);

/* Extra host kernels for tests: cuModuleGetFunction(name) finds these before tide's own kernels
 * (kernels/host_kernel.h), so a test can add a kernel or replace one (e.g. by a slow one). `run`
 * is called once for the whole grid and gets a pointer to a copy of the param_bytes parameter
 * bytes in params[0]. Registering a name again replaces it; run = NULL removes it. */
typedef struct tide_standin_grid {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
} tide_standin_grid;
typedef void (*tide_standin_kernel)(const tide_standin_grid* grid, void** params);
TIDE_STANDIN_API int tide_standin_register_kernel(const char* name, tide_standin_kernel run,
                                                  size_t param_bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif
