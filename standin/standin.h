/* Control API of the host stand-in driver, libtide_standin_cuda.so.
 *
 * The stand-in exports the cu* driver functions tide uses, backed by host memory (see
 * standin/README.md for what it simulates and how). These tide_standin_* functions let tests and
 * benchmarks read its statistics, inject faults, change the simulated hardware at run time, and
 * record and hold stream work to observe what overlaps.
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
  /* Contexts: counters (failed calls counted too, as named), then a gauge. */
  uint64_t primary_ctx_retains;    /* cuDevicePrimaryCtxRetain */
  uint64_t primary_ctx_releases;   /* cuDevicePrimaryCtxRelease that dropped a reference */
  uint64_t unretained_releases;    /* cuDevicePrimaryCtxRelease of a context with no reference
                                      left: failed with CUDA_ERROR_INVALID_CONTEXT */
  uint64_t calls_without_context;  /* calls that need a current context made with none (or a
                                      destroyed one): failed, as in CUDA */
  uint64_t destroyed_stream_uses;  /* calls given a stream after cuStreamDestroy (or after its
                                      context's end): failed with CUDA_ERROR_INVALID_HANDLE here,
                                      undefined behaviour in CUDA (handles are never reused) */
  uint64_t primary_ctx_references; /* gauge: every primary context's references now */
  uint64_t events_created;         /* cuEventCreate */
  uint64_t events_destroyed;       /* cuEventDestroy */
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
/* The nth host pinning (cuMemHostRegister or cuMemHostAlloc) from now fails with
 * CUDA_ERROR_OUT_OF_MEMORY, as a real driver's does when the host cannot lock more memory
 * (RLIMIT_MEMLOCK, memory pressure); n = 0 disarms. */
TIDE_STANDIN_API int tide_standin_fail_pin(uint64_t n);
/* The nth kernel launch (cuLaunchKernel, either default-stream flavour, with valid arguments)
 * from now fails with CUDA_ERROR_LAUNCH_FAILED, returned by the launch call, which then enqueues
 * nothing (the kernel does not run; the stream stays usable), as a real launch that the driver
 * refuses; n = 0 disarms. tide_standin_busy is not a launch. */
TIDE_STANDIN_API int tide_standin_fail_launch(uint64_t n);

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

/* Timed stream work: enqueues on `stream` (a CUstream; null: the legacy default stream of the
 * current context) an operation that occupies the stream for `seconds` from when it starts,
 * without using a CPU (its worker sleeps): a GPU kernel of that duration, for benchmarks that
 * simulate a model's forward and backward passes. It is recorded and held as a kernel
 * (TIDE_STANDIN_OP_KERNEL) named `name` (null: "busy"; truncated as kernel names are), and the
 * stream's later work, and events recorded after it, wait for it as for a kernel. Returns
 * CUDA_ERROR_INVALID_VALUE for `seconds` not finite, negative or above 3600. */
TIDE_STANDIN_API int tide_standin_busy(void* stream, double seconds, const char* name);

/* Kinds of stream work, as bits: what the recording records and what a hold holds. Memsets, event
 * records, stream waits and host functions are neither recorded nor held. */
#define TIDE_STANDIN_OP_H2D 1u    /* a copy host to device (cuMemcpyHtoD*, sync or async) */
#define TIDE_STANDIN_OP_D2H 2u    /* a copy device to host */
#define TIDE_STANDIN_OP_D2D 4u    /* a copy device to device */
#define TIDE_STANDIN_OP_KERNEL 8u /* a kernel launch */

/* The recorded timeline: stream work in submission order, each with its stream and its times, so
 * that a test can prove that work overlapped by the order of events rather than by durations.
 * Times are nanoseconds on the steady clock (CLOCK_MONOTONIC; std::chrono::steady_clock's count
 * since its epoch), the same clock for every stream and thread; 0: not yet. Synchronous copies
 * run on a default stream and are recorded like the others. */
typedef struct tide_standin_op {
  uint32_t kind;     /* one TIDE_STANDIN_OP_* */
  int32_t device;    /* the device ordinal of the stream's context */
  uint64_t stream;   /* the CUstream cuStreamCreate returned, as an integer; a default stream: an
                        id of its own (not a handle), the same for all its work */
  uint64_t dst, src; /* a copy's destination and source addresses (host or device); kernels: 0 */
  uint64_t bytes;    /* a copy's bytes; kernels: 0 */
  int64_t submit_ns; /* when the call enqueued it */
  int64_t start_ns;  /* when it started on its stream: after the work before it, the events it
                        waits for, and any hold */
  int64_t end_ns;    /* when it completed */
  char name[32];     /* a kernel: the name cuModuleGetFunction was given (truncated, NUL-ended);
                        copies: empty */
} tide_standin_op;

/* The most operations one recording holds: 2^20 (96 MiB). */
#define TIDE_STANDIN_RECORD_MAX ((size_t)1 << 20)

/* Off by default. capacity > 0: starts recording afresh (what was recorded is discarded), with
 * room for `capacity` operations (up to TIDE_STANDIN_RECORD_MAX; capacity x sizeof(tide_standin_op)
 * bytes, allocated now); work submitted once it is full is not recorded, only counted as dropped.
 * capacity 0: stops recording and frees the recording. Callable before cuInit. */
TIDE_STANDIN_API int tide_standin_record(size_t capacity);
/* Copies the first min(max, *recorded) operations of the recording into `out` (may be null when
 * max is 0), in submission order, as they are now (work still queued has start_ns or end_ns 0);
 * *recorded: how many there are; *dropped (may be null): how many did not fit. */
TIDE_STANDIN_API int tide_standin_recorded(tide_standin_op* out, size_t max, size_t* recorded,
                                           uint64_t* dropped);

/* Holds: work of a held kind (TIDE_STANDIN_OP_* bits, or-ed), when its turn comes on its stream,
 * waits before it starts, and its stream with it, until it is let through; the call that
 * submitted it returns as usual (a synchronous copy, or a pageable one, waits for it, as does
 * anything that waits for its stream). A test keeps work in flight with it for as long as it
 * needs to observe what runs meanwhile, whatever the machine's speed. Callable before cuInit.
 * Every hold must be released: a context is not destroyed while its work waits. */
TIDE_STANDIN_API int tide_standin_hold(unsigned kinds);
/* Lets `count` more held operations of each of `kinds` start (in the order they reach the hold),
 * or, with TIDE_STANDIN_RELEASE_ALL, ends the hold of those kinds. */
#define TIDE_STANDIN_RELEASE_ALL UINT64_MAX
TIDE_STANDIN_API int tide_standin_release(unsigned kinds, uint64_t count);

#ifdef __cplusplus
} /* extern "C" */
#endif
