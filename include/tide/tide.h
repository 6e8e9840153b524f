/* tide: the public C ABI of libtide.so.
 *
 * Status. Every function returns a tide_status, except those that return a value that cannot
 * fail (tide_version, tide_last_error, tide_abi_calls, the static inline *_default() initializers)
 * and the device allocator's pluggable-allocator entry points, whose signatures PyTorch fixes:
 * tide_alloc returns a pointer (NULL on failure, with tide_last_error() set), tide_free and the
 * tide_alloc_hook_* functions return nothing (their errors go to tide_last_error() and stderr),
 * and tide_alloc_throwing throws a C++ exception. On a status other than TIDE_OK,
 * tide_last_error() gives a message that says what failed and why (for a CUDA call: the call's
 * name, the error's name and its text), and the call changed nothing it was asked to change
 * (tide_optimizer_step says how a step that ran ended in its tide_step_result instead). The
 * message is per thread and stays valid until the thread's next tide call.
 *
 * Versioned structs. Every options, stats, report and descriptor struct starts with
 * `size_t struct_size`: the size of the struct as the caller's tide.h declared it. Initialize
 * each one with its tide_<name>_default() (static inline here: it sets struct_size to the
 * caller's sizeof and the library's defaults); never with zeros or memset. The library serves a
 * smaller struct_size (a caller built against an older tide.h): on input, the fields beyond it
 * keep their defaults; on output, nothing is written beyond it. It refuses a larger one (a newer
 * tide.h than the library) and one that does not cover struct_size itself with
 * TIDE_ERROR_INVALID_ARGUMENT, the message naming the struct and both sizes. New fields go at the
 * end. Plain records are not versioned: the elements of arrays (tide_param_slice,
 * tide_alloc_sample, tide_alloc_iteration, tide_subgroup_timing, tide_alloc_stat,
 * tide_subgroup_buffers) and the value types passed inside calls or other structs
 * (tide_adam_hyper, tide_adam_subgroup, tide_rates, tide_placement_policy); changing one of those
 * changes the ABI's version.
 *
 * No function has an _ex twin before 1.0: a function grows through its versioned structs.
 */
#ifndef TIDE_TIDE_H_
#define TIDE_TIDE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_API __attribute__((visibility("default")))

/* All zeros, as the *_default() initializers start their structs. */
#ifdef __cplusplus
#define TIDE_ZERO_INIT \
  {}
#else
#define TIDE_ZERO_INIT \
  { 0 }
#endif

typedef enum tide_status {
  TIDE_OK = 0,
  TIDE_ERROR_INVALID_ARGUMENT = 1, /* a bad argument or TIDE_* variable */
  TIDE_ERROR_NO_DRIVER = 2,        /* no CUDA driver could be loaded */
  TIDE_ERROR_CUDA = 3,             /* a CUDA driver call failed */
  TIDE_ERROR_OUT_OF_MEMORY = 4,
  TIDE_ERROR_INTERNAL = 5
} tide_status;

/* The library's version, "MAJOR.MINOR.PATCH". */
TIDE_API const char* tide_version(void);

/* The message of this thread's last failed call, or "" if none failed. */
TIDE_API const char* tide_last_error(void);

/* How many times this thread has entered the C ABI (every exported tide_* function but this
 * one): the boundary crossings a caller makes, e.g. per optimizer step. */
TIDE_API uint64_t tide_abi_calls(void);

/* Loads the CUDA driver (libcuda.so.1, or the library named by TIDE_CUDA_DRIVER) if not yet
 * loaded, and reports the number of devices and the driver's CUDA version (e.g. 13000). */
TIDE_API tide_status tide_driver_info(int* device_count, int* driver_version);

/* Free and total device memory of `device`, as the driver reports them. */
TIDE_API tide_status tide_device_memory(int device, size_t* free_bytes, size_t* total_bytes);

/* A TIDE_* variable as tide reads it (config/: the one parser of every knob), for callers that
 * must know a knob's value (tide.torch: TIDE_SUBGROUP_SIZE, TIDE_STATE_DTYPE, TIDE_MASTER_DTYPE,
 * TIDE_STATE_ROUNDING, TIDE_PLACEMENT). Versioned (see the top). */
typedef struct tide_knob_value {
  size_t struct_size;
  int32_t set;         /* 1: the value was given (the variable set and not empty) */
  int32_t choice;      /* a knob of named choices: the choice's index in `accepts` (TIDE_PLACEMENT:
                          a tide_placement) */
  int64_t integer;     /* TIDE_SUBGROUP_SIZE: elements; TIDE_PLACEMENT: K of
                          TIDE_PLACEMENT_INTERLEAVE, else 0 */
  const char* accepts; /* what the knob accepts, as the registry (`tide env`) says: static */
} tide_knob_value;

static inline tide_knob_value tide_knob_value_default(void) {
  tide_knob_value value = TIDE_ZERO_INIT;
  value.struct_size = sizeof(tide_knob_value);
  return value;
}

/* Parses `value` (NULL: the environment's) as knob `name` reads it. A bad value is
 * TIDE_ERROR_INVALID_ARGUMENT with the knob's message (`accepts` is filled then too); a knob
 * this call does not parse is TIDE_ERROR_INVALID_ARGUMENT naming the ones it does. */
TIDE_API tide_status tide_knob(const char* name, const char* value, tide_knob_value* out);

/* ---- pinned host arenas ---- */

/* Host memory page-locked (registered with the CUDA driver, portable) in large chunks, for
 * optimizer state, gradient buffers and staging buffers: a jemalloc arena whose extents come from
 * those chunks, plus direct buffers for large requests, placed without jemalloc's size classes.
 * Without a CUDA driver an arena still works, on ordinary host memory (stats.pinned is 0), and
 * says so once on stderr. Allocating and freeing are thread-safe. */
typedef struct tide_pinned_arena tide_pinned_arena;

/* Versioned (see the top): tide_pinned_options_default() reads the TIDE_PINNED_* variables. */
typedef struct tide_pinned_options {
  size_t struct_size;
  /* Regular chunks grow up to this (TIDE_PINNED_CHUNK, 256 MiB). */
  size_t chunk_bytes;
  /* Requests from this size up skip jemalloc's size classes (TIDE_PINNED_DIRECT, 1 MiB). */
  size_t direct_bytes;
  /* Wholly free chunks kept registered for reuse, at most (TIDE_PINNED_RETAIN, 256 MiB). */
  size_t retain_bytes;
  /* Bind chunks to this NUMA node; -1: no binding (TIDE_PINNED_NUMA_NODE, -1). */
  int numa_node;
  /* Whose primary context registers the chunks (0). */
  int device;
  /* 1: madvise(MADV_HUGEPAGE) on chunks, 0: not (TIDE_PINNED_HUGEPAGES, 1). */
  int huge_pages;
  /* Threads that touch a new chunk's pages; 0: min(8, cores) (TIDE_PINNED_TOUCH_THREADS, 0). */
  int touch_threads;
} tide_pinned_options;

/* Statistics of one arena: bytes, counts, nanoseconds. Versioned (see the top). */
typedef struct tide_pinned_stats {
  size_t struct_size;
  /* Live allocations: what callers asked for, and its peak. */
  uint64_t requested_bytes;
  uint64_t peak_requested_bytes;
  /* What live allocations occupy: jemalloc's size classes plus direct buffers. */
  uint64_t allocated_bytes;
  /* jemalloc's own count of its live allocations in the arena. */
  uint64_t jemalloc_allocated_bytes;
  /* Extents jemalloc holds: its allocations, what it caches, its metadata. */
  uint64_t jemalloc_extent_bytes;
  /* Direct buffers (requests of at least direct_bytes), page-rounded. */
  uint64_t direct_bytes;
  /* Chunks registered with the driver (only mapped, when not pinned), and the peak. */
  uint64_t pinned_bytes;
  uint64_t peak_pinned_bytes;
  /* Wholly free chunks kept for reuse. */
  uint64_t free_chunk_bytes;
  /* Chunks now; made since the arena was created; unregistered and unmapped since. */
  uint64_t chunks;
  uint64_t chunks_mapped;
  uint64_t chunks_released;
  uint64_t unregister_failures;
  uint64_t allocations;
  uint64_t frees;
  /* Time in cuMemHostRegister, in cuMemHostUnregister, and touching new chunks' pages. */
  uint64_t register_ns;
  uint64_t unregister_ns;
  uint64_t touch_ns;
  /* 1: registered with a CUDA driver; 0: ordinary host memory (no driver). */
  uint64_t pinned;
} tide_pinned_stats;

/* Writes the defaults into `options`' first options->struct_size bytes. */
TIDE_API tide_status tide_pinned_options_init(tide_pinned_options* options);
static inline tide_pinned_options tide_pinned_options_default(void) {
  tide_pinned_options options = TIDE_ZERO_INIT;
  options.struct_size = sizeof(tide_pinned_options);
  tide_pinned_options_init(&options);
  return options;
}
static inline tide_pinned_stats tide_pinned_stats_default(void) {
  tide_pinned_stats stats = TIDE_ZERO_INIT;
  stats.struct_size = sizeof(tide_pinned_stats);
  return stats;
}

/* `options` NULL: the defaults. Registers a first small chunk (jemalloc's metadata). */
TIDE_API tide_status tide_pinned_arena_create(const tide_pinned_options* options,
                                              tide_pinned_arena** arena);

/* Unregisters and unmaps everything: memory still allocated from the arena is gone. NULL: no-op. */
TIDE_API tide_status tide_pinned_arena_destroy(tide_pinned_arena* arena);

/* `bytes` aligned to `alignment` (a power of two up to 2 MiB; 0: 64) in *ptr. bytes 0: *ptr is
 * NULL. TIDE_ERROR_OUT_OF_MEMORY when the host has no memory; TIDE_ERROR_CUDA when registering a
 * new chunk fails. */
TIDE_API tide_status tide_pinned_alloc(tide_pinned_arena* arena, size_t bytes, size_t alignment,
                                       void** ptr);

/* `bytes` must be the size given to tide_pinned_alloc for `ptr` (sized deallocation: the arena
 * keeps no per-allocation record for small sizes). NULL ptr: no-op. */
TIDE_API tide_status tide_pinned_free(tide_pinned_arena* arena, void* ptr, size_t bytes);

/* Returns cached memory to the chunks and unregisters and unmaps wholly free chunks now. */
TIDE_API tide_status tide_pinned_arena_trim(tide_pinned_arena* arena);

TIDE_API tide_status tide_pinned_arena_stats(const tide_pinned_arena* arena,
                                             tide_pinned_stats* stats);

/* This process's pinned memory over every arena, against its share of the node's cap: ranks on
 * one host (LOCAL_RANK, LOCAL_WORLD_SIZE or DeepSpeed's LOCAL_SIZE) share TIDE_NODE_PINNED_LIMIT
 * equally; a chunk that would pass the share is refused at the arena's growth
 * (TIDE_ERROR_OUT_OF_MEMORY, the message naming the knob). The node's total is at most local_ranks
 * x rank_limit_bytes. */
typedef struct tide_node_pinned { /* versioned (see the top) */
  size_t struct_size;
  uint64_t node_limit_bytes; /* TIDE_NODE_PINNED_LIMIT; 0: no limit */
  uint64_t rank_limit_bytes; /* node_limit_bytes / local_ranks; 0: no limit */
  uint64_t pinned_bytes;     /* pinned by this process now, every arena */
  uint64_t peak_pinned_bytes;
  int32_t local_rank;
  int32_t local_ranks;
} tide_node_pinned;

static inline tide_node_pinned tide_node_pinned_default(void) {
  tide_node_pinned stats = TIDE_ZERO_INIT;
  stats.struct_size = sizeof(tide_node_pinned);
  return stats;
}

TIDE_API tide_status tide_node_pinned_stats(tide_node_pinned* stats);

/* ---- optimizer kernels ---- */
/* The CPU Adam/AdamW update of one subgroup (kernels/cpu_adam.h): one pass that reads the
 * gradients, updates the fp32 master weights and both moments in place, and writes the
 * low-precision copy of the weights, on the CPU thread pool (TIDE_CPU_THREADS) with the widest
 * instruction set the CPU has. Same formula as torch.optim.Adam/AdamW. */

/* Element types of optimizer buffers. */
typedef enum tide_dtype { TIDE_FLOAT32 = 0, TIDE_BFLOAT16 = 1, TIDE_FLOAT16 = 2 } tide_dtype;

/* tide_optimizer_options.state_dtype for 8-bit block-wise moments (not a tide_dtype of any other
 * buffer): exp_avg as signed and exp_avg_sq as unsigned dynamic-tree codes, one byte per element,
 * with one fp32 scale per TIDE_QUANT_BLOCK elements of each (Dettmers et al. 2022). */
#define TIDE_STATE_BLOCK_Q8 16
#define TIDE_QUANT_BLOCK 256

/* Instruction sets of the CPU kernels. */
typedef enum tide_cpu_isa {
  TIDE_CPU_ISA_AUTO = 0, /* the widest this CPU supports */
  TIDE_CPU_ISA_SCALAR = 1,
  TIDE_CPU_ISA_AVX2 = 2,       /* AVX2 + FMA + F16C */
  TIDE_CPU_ISA_AVX512 = 3,     /* AVX-512 F, BW, VL, DQ; bf16 roundings in integer operations */
  TIDE_CPU_ISA_AVX512_BF16 = 4 /* the same and AVX512_BF16: roundings by VCVTNEPS2BF16, same bits */
} tide_cpu_isa;

/* The hyperparameters of one step, as torch.optim.Adam/AdamW name them; they may change from
 * step to step. */
typedef struct tide_adam_hyper {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  double grad_scale; /* the loss scale the gradients carry: they are multiplied by
                        (float)(1 / grad_scale), as GradScaler.unscale_ does; 1: unscaled */
  int64_t step;      /* this step's number, from 1: torch's state["step"] after its increment */
  int32_t decoupled; /* 1: AdamW (decoupled weight decay); 0: Adam (L2 added to the gradient) */
  int32_t maximize;  /* 1: maximize the objective (the gradient is negated) */
} tide_adam_hyper;

/* One subgroup: `count` elements in each buffer, each buffer aligned to its element size, no
 * two overlapping. */
typedef struct tide_adam_subgroup {
  const void* grad; /* grad_dtype: TIDE_FLOAT32, TIDE_BFLOAT16 or TIDE_FLOAT16 */
  float* param;     /* fp32 master weights, updated in place */
  void* exp_avg;    /* first moment, state_dtype: TIDE_FLOAT32 or TIDE_BFLOAT16 */
  void* exp_avg_sq; /* second moment, state_dtype */
  void* param_copy; /* output: the updated weights in copy_dtype (TIDE_BFLOAT16 or
                       TIDE_FLOAT16); NULL for none */
  uint64_t count;
  int32_t grad_dtype;
  int32_t state_dtype;
  int32_t copy_dtype;
} tide_adam_subgroup;

/* How a CPU kernel runs (versioned, see the top); a NULL pointer means the defaults. */
typedef struct tide_cpu_options {
  size_t struct_size;
  int32_t threads; /* at most this many threads; 0: the pool's size (TIDE_CPU_THREADS) */
  int32_t isa;     /* a tide_cpu_isa; one the CPU lacks is TIDE_ERROR_INVALID_ARGUMENT */
  int32_t skip_subgroup_on_nonfinite; /* 1: check every gradient first and write nothing if
                                          one is not finite (one extra read of the gradients) */
} tide_cpu_options;

static inline tide_cpu_options tide_cpu_options_default(void) {
  tide_cpu_options options = TIDE_ZERO_INIT;
  options.struct_size = sizeof(tide_cpu_options);
  return options;
}

typedef struct tide_adam_result { /* versioned (see the top) */
  size_t struct_size;
  /* Elements left unchanged because their gradient (or their update) was not finite: their
   * weight, moments and copy keep their old values, so nothing non-finite is ever written.
   * With skip_subgroup_on_nonfinite and applied == 0: the number of non-finite gradients. */
  uint64_t nonfinite;
  int32_t applied; /* 0: skip_subgroup_on_nonfinite found a non-finite gradient, nothing written */
} tide_adam_result;

static inline tide_adam_result tide_adam_result_default(void) {
  tide_adam_result result = TIDE_ZERO_INIT;
  result.struct_size = sizeof(tide_adam_result);
  return result;
}

/* What the CPU kernels will use (versioned, see the top). */
typedef struct tide_cpu_info {
  size_t struct_size;
  int32_t best_isa;       /* the tide_cpu_isa TIDE_CPU_ISA_AUTO picks */
  int32_t supported_isas; /* bit (1 << isa) set for each tide_cpu_isa this CPU can run */
  int32_t threads;        /* the pool's size: TIDE_CPU_THREADS, else the CPUs this process may
                             run on */
} tide_cpu_info;

static inline tide_cpu_info tide_cpu_info_default(void) {
  tide_cpu_info info = TIDE_ZERO_INIT;
  info.struct_size = sizeof(tide_cpu_info);
  return info;
}

/* How bf16 moments are rounded after each update (tide_state_format.rounding,
 * tide_optimizer_set_state_rounding). Nearest (even) is the default; stochastic rounds up with
 * probability equal to the fraction of an ulp lost, so that moments that move by less than half
 * a bf16 ulp a step (exp_avg_sq with beta2 = 0.999) stay right on average. Its random bits are a
 * hash of (seed, step, the element's global index): the same bits on every CPU variant and on
 * the GPU, for any thread count or subgroup split. fp32 and 8-bit moments: refused
 * (TIDE_ERROR_INVALID_ARGUMENT). */
#define TIDE_STATE_ROUNDING_NEAREST 0
#define TIDE_STATE_ROUNDING_STOCHASTIC 1

/* The state format of a CPU step beyond the moments' dtype (subgroup->state_dtype); versioned
 * (see the top), NULL or tide_state_format_default(): fp32 master weights, moments rounded to
 * nearest. */
typedef struct tide_state_format {
  size_t struct_size;
  /* TIDE_FLOAT32: subgroup->param holds the fp32 master weights. TIDE_BFLOAT16: bf16 master
   * weights with compensation (no fp32 master): subgroup->param and param_copy NULL; param_bf16
   * are the bf16 weights (uint16_t bit patterns, the model's: there is no separate copy) and
   * param_comp their bf16 compensation, the part of the fp32 weight that rounding to bf16 lost.
   * Each element steps p = w + c, then w = bf16(p), c = bf16(p - w): updates too small to move w
   * accumulate in c (about 16 significant bits in all, against fp32's 24). Moments fp32 or
   * bf16, not TIDE_STATE_BLOCK_Q8. A rejected element keeps w, c and its moments. */
  int32_t master_dtype;
  /* bf16 moments (state_dtype TIDE_BFLOAT16): a TIDE_STATE_ROUNDING_*; with
   * TIDE_STATE_ROUNDING_STOCHASTIC, keyed by `seed`, hyper->step and first_index + i for element
   * i (first_index: the subgroup's element 0 in the caller's flat state, so that a subgroup
   * split does not change the bits). Other moments: TIDE_STATE_ROUNDING_NEAREST. */
  int32_t rounding;
  uint64_t seed;
  uint64_t first_index;
  /* 8-bit moments (state_dtype TIDE_STATE_BLOCK_Q8): exp_avg and exp_avg_sq are `count` uint8
   * codes each, at a TIDE_QUANT_BLOCK-byte boundary, and these their ceil(count /
   * TIDE_QUANT_BLOCK) fp32 block scales (tide_optimizer_q8_scales says how to read them). */
  float* exp_avg_scale;
  float* exp_avg_sq_scale;
  uint16_t* param_bf16; /* master_dtype TIDE_BFLOAT16: the weights and their compensation */
  uint16_t* param_comp;
} tide_state_format;

static inline tide_state_format tide_state_format_default(void) {
  tide_state_format format = TIDE_ZERO_INIT;
  format.struct_size = sizeof(tide_state_format);
  return format;
}

/* One Adam/AdamW step over the subgroup, in the state format that subgroup->state_dtype and
 * `format` describe. `format` and `options` NULL: defaults; `result` may be NULL. A non-finite
 * gradient is not an error: it is reported in `result`. */
TIDE_API tide_status tide_cpu_adam_step(const tide_adam_subgroup* subgroup,
                                        const tide_state_format* format,
                                        const tide_adam_hyper* hyper,
                                        const tide_cpu_options* options, tide_adam_result* result);

/* The number of NaN and infinite values among `count` values of `dtype` (a loss scaler's
 * check, e.g. of each subgroup's gradients as they arrive). */
TIDE_API tide_status tide_cpu_count_nonfinite(const void* values, int32_t dtype, uint64_t count,
                                              const tide_cpu_options* options, uint64_t* nonfinite);

/* fp32 → bf16/fp16 with round-to-nearest-even (NaN stays NaN, overflow gives infinity). */
TIDE_API tide_status tide_cpu_cast(const float* src, void* dst, int32_t dst_dtype, uint64_t count,
                                   const tide_cpu_options* options);

TIDE_API tide_status tide_cpu_kernels_info(tide_cpu_info* info);

/* The code maps of 8-bit moments (TIDE_STATE_BLOCK_Q8; kernels/quant8.h): exp_avg's 128
 * magnitudes (code & 127; bit 7 is the sign) and the 127 fp32 midpoints between them, exp_avg_sq's
 * 256 values and 255 midpoints, each sorted. A value y (normalized by its block's scale) gets the
 * number of midpoints strictly below it as its code. Static storage; any output may be NULL. */
TIDE_API tide_status tide_q8_code_maps(const float** exp_avg_magnitudes,
                                       const float** exp_avg_midpoints,
                                       const float** exp_avg_sq_values,
                                       const float** exp_avg_sq_midpoints);

/* ---- device caching allocator ---- */
/* tide's device caching allocator (allocator/caching_allocator.h): one per device, created on
 * first use with the TIDE_ALLOC_* configuration, with its memory telemetry. PyTorch uses it
 * through torch.cuda.memory.CUDAPluggableAllocator (python: tide.torch.use_allocator()). A
 * `stream` is a CUstream / cudaStream_t (the same handle), as void* here; NULL is the default
 * (legacy) stream. */

/* Allocation with the pluggable-allocator signature. tide_alloc returns NULL when the device (or
 * the configured limit) is out of memory, after giving cached memory back and retrying;
 * tide_last_error() then says what was asked and what was held, and the failure is recorded
 * (tide_alloc_last_oom). `size` 0: NULL. tide_free takes the size and stream the memory was
 * allocated with (PyTorch passes them); a bad pointer is reported on stderr.
 *
 * tide_alloc_throwing is what PyTorch's CUDAPluggableAllocator gets (tide.torch.use_allocator()):
 * PyTorch keeps whatever the function returns as the tensor's memory, a NULL included, so a
 * failure must not return. It throws a C++ std::runtime_error instead ("CUDA out of memory.
 * tide: out of memory on device D: asked for ..., live, reserved, limit, ..."; or the failing
 * driver call), which PyTorch's bindings turn into a RuntimeError, as from its own allocator. For
 * C++ callers that handle exceptions only: never call it from C or through ctypes. */
TIDE_API void* tide_alloc(size_t size, int device, void* stream);
TIDE_API void* tide_alloc_throwing(size_t size, int device, void* stream);
TIDE_API void tide_free(void* ptr, size_t size, int device, void* stream);

/* PyTorch's optional pluggable-allocator hooks (CUDAPluggableAllocator::set_init_fn,
 * set_reset_fn, set_memory_fraction_fn, set_record_stream_fn; C++ only: PyTorch's Python API
 * cannot set them). Errors go to tide_last_error() and stderr. */
TIDE_API void tide_alloc_hook_init(int device_count);
TIDE_API void tide_alloc_hook_reset(void); /* empty cache, every device */
TIDE_API void tide_alloc_hook_memory_fraction(double fraction, int device);
TIDE_API void tide_alloc_hook_record_stream(void* ptr, void* stream);

/* One statistic: its current value, its peak since the last peak reset, and the totals added
 * and removed since the last reset of accumulated statistics. */
typedef struct tide_alloc_stat {
  uint64_t current;
  uint64_t peak;
  uint64_t allocated;
  uint64_t freed;
} tide_alloc_stat;

/* The allocator's statistics, as PyTorch's torch.cuda.memory_stats() names them. Arrays: [0] all
 * pools, [1] the small pool (blocks up to 1 MiB), [2] the large pool. Versioned (see the top). */
typedef struct tide_alloc_stats {
  size_t struct_size;
  tide_alloc_stat allocated_bytes[3]; /* blocks handed out (rounded to 512 B) */
  tide_alloc_stat requested_bytes[3]; /* what callers asked for */
  tide_alloc_stat reserved_bytes[3];  /* held from the driver */
  tide_alloc_stat active_bytes[3];    /* allocated, or freed and awaiting other streams */
  tide_alloc_stat allocation[3];      /* number of blocks handed out */
  tide_alloc_stat active[3];
  tide_alloc_stat segment[3];       /* number of segments */
  uint64_t inactive_split_bytes[3]; /* free bytes in partly used segments */
  uint64_t inactive_split[3];
  uint64_t num_alloc_retries;    /* allocations that released the cache and retried */
  uint64_t num_ooms;             /* allocations that failed */
  uint64_t num_sync_all_streams; /* waits for all streams' pending frees */
  uint64_t num_device_alloc;     /* driver allocation calls (cuMemAlloc, cuMemCreate) */
  uint64_t num_device_free;      /* driver free calls (cuMemFree, page unmaps) */
  uint64_t memory_limit;         /* cap on reserved bytes */
  uint64_t thread_cached_bytes;  /* small free blocks in threads' caches */
  uint64_t largest_free_block;
  uint64_t growable; /* 1: the large pool grows one range through VMM */
  /* Allocations served from threads' caches without the lock (accumulated), of
   * allocation[1].allocated. */
  uint64_t thread_cache_hits;
} tide_alloc_stats;

static inline tide_alloc_stats tide_alloc_stats_default(void) {
  tide_alloc_stats stats = TIDE_ZERO_INIT;
  stats.struct_size = sizeof(tide_alloc_stats);
  return stats;
}

TIDE_API tide_status tide_alloc_get_stats(int device, tide_alloc_stats* stats);
TIDE_API tide_status tide_alloc_reset_peak_stats(int device);
TIDE_API tide_status tide_alloc_reset_accumulated_stats(int device);
/* Gives cached free memory back to the driver (after waiting for pending frees). -1: every
 * device whose allocator exists. */
TIDE_API tide_status tide_alloc_empty_cache(int device);
/* Caps the memory the allocator holds at `fraction` (0 < fraction <= 1) of the device's. */
TIDE_API tide_status tide_alloc_set_memory_fraction(int device, double fraction);
/* The block at `ptr` is used on `stream` too: it is not reused before the work submitted there
 * until it is freed has completed (torch.Tensor.record_stream). */
TIDE_API tide_status tide_alloc_record_stream(void* ptr, void* stream);

/* Phase marks. An iteration runs from one TIDE_PHASE_ITERATION_END to the next; marks of the
 * phases within it are optional (what is not marked is detected from the memory curve; with no
 * marks at all, iterations are detected too). */
typedef enum tide_phase {
  TIDE_PHASE_FORWARD = 0,
  TIDE_PHASE_BACKWARD = 1,
  TIDE_PHASE_UPDATE = 2,
  TIDE_PHASE_ITERATION_END = 3
} tide_phase;

/* -1: every device whose allocator exists (device 0 if none does yet). */
TIDE_API tide_status tide_alloc_mark_phase(int device, int phase);

typedef struct tide_alloc_sample {
  uint64_t t_ns; /* steady clock, nanoseconds */
  uint64_t live_bytes;
  uint64_t reserved_bytes;
} tide_alloc_sample;

/* One iteration. Phases: [0] forward, [1] backward, [2] update. */
typedef struct tide_alloc_iteration {
  uint64_t index;
  uint64_t start_ns;
  uint64_t end_ns;
  uint64_t phase_start_ns[3];
  uint64_t peak_live_bytes[3];
  uint64_t peak_reserved_bytes[3];
  uint64_t peak_live_all_bytes;
  uint64_t min_live_bytes;
  uint32_t phase_seen; /* bit p: phase p was marked or detected */
  uint32_t detected;   /* 1: boundaries or phases come from the curve, not from marks */
} tide_alloc_iteration;

typedef struct tide_alloc_forecast { /* versioned (see the top) */
  size_t struct_size;
  uint64_t headroom_bytes;    /* what the coming update phase can use safely */
  uint64_t update_peak_bytes; /* forecast peak live bytes of the update phase */
  uint64_t limit_bytes;       /* what this process may hold on the device */
  uint64_t margin_bytes;      /* safety margin (TIDE_HEADROOM_MARGIN of the limit) */
  int32_t iterations;         /* recent iterations it comes from; 0: none seen yet */
  int32_t detected;           /* 1: from detected phases */
  /* What can be held through a whole iteration (allocated before the forward pass, freed after
   * the update: gradients kept on the GPU): the limit above the iterations' highest peak, less
   * the margin; 0 before any iteration was seen. Never above headroom_bytes. */
  uint64_t held_headroom_bytes;
  uint64_t iteration_peak_bytes; /* forecast peak live bytes of a whole iteration */
} tide_alloc_forecast;

static inline tide_alloc_forecast tide_alloc_forecast_default(void) {
  tide_alloc_forecast forecast = TIDE_ZERO_INIT;
  forecast.struct_size = sizeof(tide_alloc_forecast);
  return forecast;
}

typedef struct tide_alloc_oom { /* versioned (see the top) */
  size_t struct_size;
  uint64_t t_ns;
  uint64_t requested_bytes;
  uint64_t block_bytes;
  uint64_t live_bytes;
  uint64_t reserved_bytes;
  uint64_t limit_bytes;
  uint64_t device_free_bytes;
  uint64_t device_total_bytes;
  uint64_t largest_free_block;
  uint32_t limit_reached; /* 1: the configured limit refused, not the device */
} tide_alloc_oom;

static inline tide_alloc_oom tide_alloc_oom_default(void) {
  tide_alloc_oom oom = TIDE_ZERO_INIT;
  oom.struct_size = sizeof(tide_alloc_oom);
  return oom;
}

/* The newest samples of the live/reserved timeline, oldest first: at most `capacity` into `out`,
 * the number written in *count. out NULL: *count = the number of samples kept. */
TIDE_API tide_status tide_alloc_timeline(int device, tide_alloc_sample* out, size_t capacity,
                                         size_t* count);
/* Recent iterations, oldest first, as tide_alloc_timeline. */
TIDE_API tide_status tide_alloc_iterations(int device, tide_alloc_iteration* out, size_t capacity,
                                           size_t* count);
TIDE_API tide_status tide_alloc_headroom(int device, tide_alloc_forecast* forecast);
/* The last out-of-memory failure: *found 0 if there was none. */
TIDE_API tide_status tide_alloc_last_oom(int device, tide_alloc_oom* oom, int* found);
/* The timeline, phases, marks and out-of-memory events as Chrome trace JSON (Perfetto). */
TIDE_API tide_status tide_alloc_export_timeline(int device, const char* path);
/* Records allocation events (the text format of allocator/telemetry/trace.h; `tide replay` runs
 * it back), at most `max_events`; stop writes them to `path` (NULL: discards them). */
TIDE_API tide_status tide_alloc_trace_start(int device, size_t max_events);
TIDE_API tide_status tide_alloc_trace_stop(int device, const char* path);

/* ---- planner ---- */

/* The performance model's rates, per rank: params/s for updates, bytes/s for copies. */
typedef struct tide_rates {
  double cpu_update;           /* CPU update, no copies running */
  double cpu_update_contended; /* CPU update while copies run */
  double h2d;                  /* pinned host -> GPU copy, alone */
  double d2h;                  /* GPU -> pinned host copy, alone */
  double h2d_duplex;           /* host -> GPU while GPU -> host also runs */
  double d2h_duplex;           /* GPU -> host while host -> GPU also runs */
  double gpu_update;           /* GPU update */
} tide_rates;

/* The rates tide uses: built-in defaults, then the calibration file (`calibration_path`, or the
 * default path when NULL, read if it exists), then the TIDE_RATE_* variables. */
TIDE_API tide_status tide_rates_resolve(const char* calibration_path, tide_rates* rates);

/* The model's host memory rates, bytes/s through host DRAM (reads and writes counted): the CPU
 * update threads alone, and everything (CPU threads and both copy directions) while copies run
 * both ways. The CPU update and the GPU subgroups' copies share this budget. Versioned (see the
 * top); tide_host_memory_rates_default() sets both to 0. */
typedef struct tide_host_memory_rates {
  size_t struct_size;
  double host_memory;           /* CPU update alone */
  double host_memory_contended; /* with copies running both ways */
} tide_host_memory_rates;

static inline tide_host_memory_rates tide_host_memory_rates_default(void) {
  tide_host_memory_rates rates = TIDE_ZERO_INIT;
  rates.struct_size = sizeof(tide_host_memory_rates);
  return rates;
}

/* The host memory rates from the sources tide_rates_resolve reads (TIDE_RATE_HOST_MEMORY_GBPS,
 * TIDE_RATE_HOST_MEMORY_CONTENDED_GBPS). */
TIDE_API tide_status tide_host_memory_rates_resolve(const char* calibration_path,
                                                    tide_host_memory_rates* rates);

/* What a GPU subgroup moves and holds per parameter, and the CPU update rate of its state
 * format. Versioned (see the top); tide_plan_footprint_default(): 12 state bytes (fp32 p, m, v),
 * 2 gradient bytes, gradients kept on the GPU, 2 weight bytes uploaded, factors from the
 * calibration file. */
typedef struct tide_plan_footprint {
  size_t struct_size;
  uint32_t state_bytes_per_param;     /* copied in and out: 12 for fp32 p, m, v; 8 with bf16
                                         moments (the update rates, given for fp32 state, are
                                         then scaled by the bytes an update moves); 6 with 8-bit
                                         moments (fp32 weights, one byte per moment); 12 or 8 with
                                         bf16 master weights (bf16 weights and compensation, fp32
                                         or bf16 moments) */
  uint32_t gradient_bytes_per_param;  /* e.g. 2 for bf16 */
  int gradients_on_gpu;               /* 1: kept on the GPU (memory); 0: copied in from host */
  int quantized_moments;              /* 1: 8-bit block-wise moments (state_bytes_per_param 6):
                                         their fp32 block scales are copied with the state, and the
                                         CPU update runs at 8-bit moments' rate (default 0) */
  int bf16_master;                    /* 1: bf16 master weights: a GPU subgroup takes its 2 weight
                                         bytes from the model's parameters on the GPU, and an
                                         update writes no weight copy; not with quantized_moments
                                         (default 0) */
  uint32_t weight_bytes_per_param;    /* low-precision weights a CPU subgroup uploads to the GPU
                                         (default 2, bf16; 0: none) */
  double cpu_update_factor;           /* the CPU update rate in this format over fp32 state's
                                         (`tide calibrate` measures it: the calibration file's
                                         cpu_update_factors), 0.01 to 100; 0 (default): the
                                         calibration file's for the format when `rates` is NULL,
                                         else tide's model (the bytes an update moves; 8-bit
                                         moments: 0.35) */
  double cpu_update_contended_factor; /* the same for the CPU update while copies run (the
                                        file's cpu_update_contended_factors), 0.01 to 100; 0
                                        (default): the calibration file's when `rates` is NULL
                                        and cpu_update_factor is 0, else cpu_update_factor's
                                        factor (the free rate's) */
} tide_plan_footprint;

/* Writes the defaults into `footprint`'s first footprint->struct_size bytes. */
TIDE_API tide_status tide_plan_footprint_init(tide_plan_footprint* footprint);
static inline tide_plan_footprint tide_plan_footprint_default(void) {
  tide_plan_footprint footprint = TIDE_ZERO_INIT;
  footprint.struct_size = sizeof(tide_plan_footprint);
  tide_plan_footprint_init(&footprint);
  return footprint;
}

typedef struct tide_plan_summary { /* versioned (see the top) */
  size_t struct_size;
  double phase_seconds;    /* predicted update phase */
  double cpu_side_seconds; /* predicted CPU workers' time */
  double gpu_side_seconds; /* predicted GPU pipeline's time */
  double all_cpu_seconds;  /* predicted with every subgroup on the CPU */
  uint64_t buffers;        /* GPU buffers in flight */
  uint64_t buffer_bytes;   /* bytes of one buffer */
  uint64_t gpu_bytes;      /* GPU memory the plan needs: buffers and kept gradients */
  int optimal;             /* 1 when the search was exhaustive */
} tide_plan_summary;

static inline tide_plan_summary tide_plan_summary_default(void) {
  tide_plan_summary summary = TIDE_ZERO_INIT;
  summary.struct_size = sizeof(tide_plan_summary);
  return summary;
}

/* Plans one update phase of `count` subgroups of `subgroup_params[i]` parameters with
 * `headroom_bytes` of GPU memory. Writes, per subgroup i: device[i] (0 CPU, 1 GPU) and order[i]
 * (its position in its device's order; GPU subgroup at position j uses buffer j % buffers).
 * `footprint` and `rates` may be NULL (defaults; rates as tide_rates_resolve(NULL), with the
 * calibration file's CPU update factor for the state format). */
TIDE_API tide_status tide_plan(const uint64_t* subgroup_params, size_t count,
                               uint64_t headroom_bytes, const tide_plan_footprint* footprint,
                               const tide_rates* rates, uint8_t* device, uint32_t* order,
                               tide_plan_summary* summary);

/* ---- executor ---- */
/* The offloading optimizer's core: the optimizer state of one rank in subgroups (fp32 master
 * weights and moments and the gradients in pinned host memory, the model's parameters on the
 * GPU), gradient offload during backward, and the update phase that runs a plan (some subgroups
 * on the GPU through copy streams and the fused Adam kernel, the rest on the CPU, overlapped).
 *
 * How a torch.optim.Optimizer subclass drives it, per rank:
 *   __init__:  flatten the parameters into subgroups (tide_optimizer_create with one slice per
 *              parameter tensor or piece of one), then write the fp32 master weights (and any
 *              loaded moments) through tide_optimizer_buffers' pointers.
 *   each step: optionally tide_optimizer_prepare (before backward: plans the coming update so
 *              that GPU subgroups can keep their gradients on the GPU); in each gradient hook,
 *              tide_optimizer_offload_gradient (returns at once; mark the gradient tensor with
 *              record_stream on tide_optimizer_offload_stream's stream); in step(),
 *              tide_optimizer_grad_stats if a loss scaler or gradient clipping needs them,
 *              then tide_optimizer_step with that step's hyperparameters (lr schedule,
 *              grad_scale, step number) and the allocator's headroom (tide_alloc_headroom).
 *   state_dict: read the pinned buffers (tide_optimizer_buffers).
 * Every call but the offload must come from one thread at a time; offload calls may come from
 * any thread. The updated low-precision weights are in the model's parameters when
 * tide_optimizer_step returns.
 *
 * A step happens exactly, or not at all. tide_optimizer_step first does what the step needs
 * before it can change anything (tide_optimizer_ready); if that fails it returns the error and
 * nothing changed. After that, whatever fails (a copy, an allocation, a kernel, the device) the
 * step completes with the bits it would have had without the fault: a GPU subgroup that failed
 * is redone on the CPU from its untouched state. The step's tide_step_result says how it ended
 * and which subgroup is where: the model's parameters of some subgroups may not have been
 * written (the device could not take the new weights: write them from the master weights, or
 * call tide_optimizer_write_params once it can) and, only with a lost device, some subgroups
 * may not have been updated: those whose gradient was kept on it only (gradients_on_gpu
 * TIDE_GRADIENTS_GPU) or whose state was resident there (tide_optimizer_sync_state). No work the
 * call enqueued writes anything after it returns but the same committed weights, and only where
 * a lost device could not be waited for. A step of several optimizers that must succeed or fail
 * together calls tide_optimizer_ready on every one of them first. */

typedef struct tide_optimizer tide_optimizer;

/* Elements [offset, offset + count) of subgroup `subgroup` are the model parameters at
 * `device_ptr` (param_dtype elements, aligned to their size). Each subgroup's slices must cover
 * it exactly. */
typedef struct tide_param_slice {
  uint64_t subgroup;
  uint64_t offset;
  uint64_t count;
  uint64_t device_ptr; /* a CUdeviceptr */
} tide_param_slice;

/* tide_optimizer_options.gradients_on_gpu: where the GPU subgroups of a plan made by
 * tide_optimizer_prepare take their gradients from (their buffers are held from then on through
 * the forward and backward passes). TIDE_GRADIENTS_HOST: pinned memory, copied in with the
 * state. TIDE_GRADIENTS_GPU: kept on the GPU only (device-to-device offload); the backward pass
 * copies nothing to the host for them, and a device lost before they are read loses them
 * (TIDE_STEP_INCOMPLETE). TIDE_GRADIENTS_AUTO, the default: kept on the GPU where tide's
 * allocator forecasts the memory (it can take them back from a forward pass past its forecast)
 * and the model predicts the update no slower that way, and offloaded to pinned memory as well,
 * so that the step stays exact or unchanged whatever the device does; the update copies them in
 * no more. */
#define TIDE_GRADIENTS_HOST 0
#define TIDE_GRADIENTS_GPU 1
#define TIDE_GRADIENTS_AUTO 2

typedef struct tide_optimizer_options { /* versioned (see the top) */
  size_t struct_size;
  int32_t device;           /* CUDA device ordinal */
  int32_t grad_dtype;       /* tide_dtype of the gradients (default TIDE_BFLOAT16) */
  int32_t param_dtype;      /* tide_dtype of the model's parameters (default TIDE_BFLOAT16) */
  int32_t gradients_on_gpu; /* where a prepared plan's GPU subgroups take their gradients from:
                               a TIDE_GRADIENTS_* (default TIDE_GRADIENTS_AUTO) */
  uint64_t max_buffers;     /* cap on GPU buffers in flight; 0: as many as fit and help */
  int32_t use_rates;        /* 1: start from `rates` (and host_memory_rate below); 0:
                               tide_rates_resolve(NULL), tide_host_memory_rates_resolve(NULL) */
  int32_t refine;           /* 1: measured subgroup times refine the rates (default) */
  tide_rates rates;
  int32_t cpu_threads;  /* threads for the CPU subgroups' updates; 0: the pool's all (the pool
                           has TIDE_CPU_THREADS, default: the CPUs this process may run on) */
  int32_t state_dtype;  /* tide_dtype of the moments (exp_avg, exp_avg_sq): TIDE_FLOAT32 (default)
                           or TIDE_BFLOAT16 (rounded to nearest even at every update; a GPU
                           subgroup then copies 8 instead of 12 bytes per parameter each way),
                           or TIDE_STATE_BLOCK_Q8 (8-bit codes and block scales: 6 bytes and the
                           scales; see tide_optimizer_q8_scales). */
  int32_t master_dtype; /* tide_dtype of the master weights: TIDE_FLOAT32 (default: an fp32
                           copy in pinned memory) or TIDE_BFLOAT16 (bf16 master weights with
                           compensation, tide_cpu_adam_step_bf16_master: the model's bf16
                           parameters are the master, bit for bit; pinned memory holds them and
                           their bf16 compensation, no fp32 master and no separate weight copy;
                           see tide_optimizer_master_bf16). TIDE_BFLOAT16 needs param_dtype
                           TIDE_BFLOAT16 and state_dtype TIDE_FLOAT32 or TIDE_BFLOAT16. */
  int32_t host_params;  /* 1: the slices' device_ptr are host addresses of fp32 parameters that are
                           their own master weights (FSDP2's CPUOffloadPolicy): updated in place,
                           no master copy, no gradient buffer (param_dtype TIDE_FLOAT32, moments
                           TIDE_FLOAT32 or TIDE_BFLOAT16; not with gradients_on_gpu, nor with
                           master_dtype TIDE_BFLOAT16, which needs bf16 parameters: creating
                           the optimizer fails). Each step's gradients are read where they are:
                           tide_optimizer_set_gradients. */
  double host_memory_rate;           /* with use_rates: bytes/s through host memory, the CPU
                                        update alone (tide_host_memory_rates); 0 (default): the
                                        built-in rate */
  double host_memory_contended_rate; /* with use_rates: the same with copies running both ways;
                                        0 (default): the built-in rate */
} tide_optimizer_options;

/* Writes the defaults into `options`' first options->struct_size bytes. */
TIDE_API tide_status tide_optimizer_options_init(tide_optimizer_options* options);
static inline tide_optimizer_options tide_optimizer_options_default(void) {
  tide_optimizer_options options = TIDE_ZERO_INIT;
  options.struct_size = sizeof(tide_optimizer_options);
  tide_optimizer_options_init(&options);
  return options;
}

/* The rules between the options' fields (state, master and parameter dtypes, host_params) that
 * tide_optimizer_create checks, without creating anything: TIDE_ERROR_INVALID_ARGUMENT with the
 * rule's message when they do not go together. */
TIDE_API tide_status tide_optimizer_options_check(const tide_optimizer_options* options);

/* The CPU update rate of each state format over fp32 state's (what `tide calibrate` writes to the
 * calibration file's cpu_update_factors and cpu_update_contended_factors), for callers that pass
 * their own rates (tide_optimizer_options.use_rates) measured elsewhere. Versioned (see the top):
 * tide_cpu_update_factors_default() sets every factor to 0. Each factor is 0 (not measured:
 * tide's model for that format, the bytes an update moves, 8-bit moments 0.35) or from 0.01 to
 * 100; a contended factor of 0 takes the format's free one. */
typedef struct tide_cpu_update_factors {
  size_t struct_size;
  double bf16_moments;             /* CPU update alone: bf16 moments, fp32 master */
  double q8_moments;               /* 8-bit block-wise moments, fp32 master */
  double bf16_master;              /* bf16 master weights, fp32 moments */
  double bf16_master_bf16_moments; /* bf16 master weights, bf16 moments */
  double bf16_moments_contended;   /* the same four while copies run (cpu_update_contended) */
  double q8_moments_contended;
  double bf16_master_contended;
  double bf16_master_bf16_moments_contended;
} tide_cpu_update_factors;

static inline tide_cpu_update_factors tide_cpu_update_factors_default(void) {
  tide_cpu_update_factors factors = TIDE_ZERO_INIT;
  factors.struct_size = sizeof(tide_cpu_update_factors);
  return factors;
}

/* `count` subgroups of subgroup_params[i] parameters; `slices` (slice_count of them) place their
 * elements in the model. `options` NULL: the defaults. `factors`: the CPU update factors the
 * planner applies to the fp32 CPU update rates for the optimizer's state format; NULL: the
 * calibration file's when the rates are resolved, else the model's; given, they replace the
 * calibration file's (a factor that is neither 0 nor within 0.01 to 100 is
 * TIDE_ERROR_INVALID_ARGUMENT naming the field). Allocates the pinned buffers (zeroed). On an
 * error nothing is created. */
TIDE_API tide_status tide_optimizer_create(const uint64_t* subgroup_params, size_t count,
                                           const tide_param_slice* slices, size_t slice_count,
                                           const tide_optimizer_options* options,
                                           const tide_cpu_update_factors* factors,
                                           tide_optimizer** optimizer);

/* Waits for work in flight, then frees everything. NULL: no-op. */
TIDE_API tide_status tide_optimizer_destroy(tide_optimizer* optimizer);

/* A subgroup's pinned host buffers, `count` elements each. A step may move a subgroup's state
 * (param, exp_avg, exp_avg_sq) to other buffers: these pointers are valid until the next
 * tide_optimizer_step; the gradient buffer never moves. */
typedef struct tide_subgroup_buffers {
  float* param;     /* fp32 master weights; NULL with master_dtype TIDE_BFLOAT16 or host_params
                       (the parameters are the master weights) */
  void* exp_avg;    /* the options' state_dtype: fp32, bf16 (uint16_t bit patterns), or
                       TIDE_STATE_BLOCK_Q8's uint8_t codes (at a TIDE_QUANT_BLOCK-byte boundary) */
  void* exp_avg_sq; /* the same */
  void* grad;       /* grad_dtype: where offloaded gradients land (NULL with host_params) */
  uint64_t count;
} tide_subgroup_buffers;

TIDE_API tide_status tide_optimizer_buffers(tide_optimizer* optimizer, size_t subgroup,
                                            tide_subgroup_buffers* buffers);

/* With master_dtype TIDE_BFLOAT16: a subgroup's bf16 master weights (the values its model
 * parameters hold after every step, and what tide_optimizer_write_params writes) and their bf16
 * compensation, `count` uint16_t bit patterns each, valid as long as tide_optimizer_buffers'
 * pointers. A step updates both (w + c is the weight, kept to about 16 significant bits). A GPU
 * subgroup takes the weights from the model's parameters (device to device; only the
 * compensation and the moments are copied in), so those must hold these weights at each step:
 * after writing the weights here (a load), call tide_optimizer_write_params. Other master
 * dtypes: NULL. */
TIDE_API tide_status tide_optimizer_master_bf16(tide_optimizer* optimizer, size_t subgroup,
                                                uint16_t** weights, uint16_t** compensation);

/* With state_dtype TIDE_STATE_BLOCK_Q8: the fp32 scales of a subgroup's moments, one per block
 * of TIDE_QUANT_BLOCK elements counted from the subgroup's element 0 (*blocks of each; the last
 * block may be partial). Element e of exp_avg is kQ8SignedMagnitudes[code & 127] * scale, negated
 * when code & 128, and of exp_avg_sq kQ8UnsignedValues[code] * scale (kernels/quant8_maps.h).
 * Valid as long as tide_optimizer_buffers' pointers. Other state dtypes: NULL and 0 blocks. */
TIDE_API tide_status tide_optimizer_q8_scales(tide_optimizer* optimizer, size_t subgroup,
                                              float** exp_avg_scale, float** exp_avg_sq_scale,
                                              uint64_t* blocks);

/* How the optimizer rounds its bf16 moments from the next step on: TIDE_STATE_ROUNDING_NEAREST
 * (the default) or TIDE_STATE_ROUNDING_STOCHASTIC keyed by `seed` (with each step's number and
 * each element's index in the optimizer's flat state: subgroup i's elements follow those of
 * subgroups 0 to i - 1). The seed is part of the state a resumed run needs for the same bits.
 * Other state dtypes: TIDE_ERROR_INVALID_ARGUMENT with stochastic rounding. */
TIDE_API tide_status tide_optimizer_set_state_rounding(tide_optimizer* optimizer, int32_t rounding,
                                                       uint64_t seed);

/* Copies `count` gradient elements (`dtype`, the optimizer's grad_dtype) at device pointer `src`,
 * produced on `stream` (a CUstream; NULL: the legacy default stream), into elements
 * [offset, offset + count) of `subgroup`'s gradient, asynchronously: returns without waiting
 * for the gradient or the copy. Thread-safe. */
TIDE_API tide_status tide_optimizer_offload_gradient(tide_optimizer* optimizer, size_t subgroup,
                                                     uint64_t offset, uint64_t src, uint64_t count,
                                                     int32_t dtype, void* stream);
/* The side stream (a CUstream) the offload copies run on. */
TIDE_API tide_status tide_optimizer_offload_stream(tide_optimizer* optimizer, void** stream);

/* Waits for every offloaded gradient, then reads them: the sum of squares of all gradient
 * elements (unscaled: divide by grad_scale^2 for the true norm^2) and the number that are not
 * finite (a loss scaler skips the step when it is not 0). Reads every gradient once on the CPU
 * (2 bytes per parameter for bf16: a few percent of an update phase). */
TIDE_API tide_status tide_optimizer_grad_stats(tide_optimizer* optimizer, double* sum_squares,
                                               uint64_t* nonfinite);

/* Placement policies of the update phase. */
typedef enum tide_placement {
  TIDE_PLACEMENT_AUTO = 0,      /* the planner's plan within the headroom */
  TIDE_PLACEMENT_CPU = 1,       /* every subgroup on the CPU */
  TIDE_PLACEMENT_GPU = 2,       /* every subgroup on the GPU (buffers that fit) */
  TIDE_PLACEMENT_INTERLEAVE = 3 /* one GPU subgroup every k */
} tide_placement;

typedef struct tide_placement_policy {
  int32_t kind; /* tide_placement */
  int32_t k;    /* TIDE_PLACEMENT_INTERLEAVE: k >= 1 */
} tide_placement_policy;

/* Plans the coming update phase now (call before backward). Optional; needed for
 * gradients_on_gpu (with TIDE_GRADIENTS_AUTO, where keeping them does not pay, nothing is
 * prepared and the step plans with its own headroom). `policy` NULL: TIDE_PLACEMENT, else
 * auto. The kept gradients' buffers are allocated now and held through the forward and
 * backward passes: pass what fits at their peak (tide_alloc_forecast's held_headroom_bytes),
 * not the update phase's headroom_bytes. */
TIDE_API tide_status tide_optimizer_prepare(tide_optimizer* optimizer,
                                            const tide_placement_policy* policy,
                                            uint64_t headroom_bytes);

/* Everything a step needs before it can change anything: checks `hyper`, waits for the
 * gradients offloaded so far and for work an earlier failed step left queued. An error:
 * nothing changed. tide_optimizer_step does it itself: call it first only to make a step of
 * several optimizers succeed or fail together (tide_optimizer_ready on every one of them, then
 * their steps). */
TIDE_API tide_status tide_optimizer_ready(tide_optimizer* optimizer, const tide_adam_hyper* hyper);

/* tide_step_request.flags: what the step call does around the update phase, so that a step is
 * one call. */
#define TIDE_STEP_HEADROOM_FORECAST                             \
  1u /* headroom_bytes from tide's allocator's forecast for the \
        optimizer's device (tide_alloc_headroom) */
#define TIDE_STEP_MARK_PHASES                                   \
  2u /* tide_alloc_mark_phase(device, TIDE_PHASE_UPDATE) first, \
        TIDE_PHASE_ITERATION_END after a step that happened */
#define TIDE_STEP_RELEASE_BUFFERS                        \
  4u /* tide_optimizer_release_buffers after a step that \
        happened */

/* What a step is asked to do. Versioned (see the top). */
typedef struct tide_step_request {
  size_t struct_size;
  tide_adam_hyper hyper;
  const tide_placement_policy* policy; /* NULL: TIDE_PLACEMENT, else auto */
  uint64_t headroom_bytes;             /* GPU memory the update phase may use */
  uint32_t flags;                      /* TIDE_STEP_* */
  /* Frozen slices as tide_optimizer_set_frozen takes them (frozen_count: the slice count given
   * at creation), set before the step; NULL: as set before. */
  const uint8_t* frozen;
  size_t frozen_count;
} tide_step_request;

static inline tide_step_request tide_step_request_default(void) {
  tide_step_request request = TIDE_ZERO_INIT;
  request.struct_size = sizeof(tide_step_request);
  return request;
}

/* How a step ended (tide_step_result.outcome). */
typedef enum tide_step_outcome {
  TIDE_STEP_COMPLETED = 0,             /* every subgroup updated, the model's parameters written */
  TIDE_STEP_COMPLETED_AFTER_FAULT = 1, /* the same bits as without the fault, which `reason` says:
                                          failed GPU subgroups were redone on the CPU
                                          (rolled_forward); the model's parameters of `unwritten`
                                          subgroups could not be written (write them from the
                                          master weights, or tide_optimizer_write_params once the
                                          device can) */
  TIDE_STEP_NOT_HAPPENED = 2,          /* nothing changed: `reason`; the call returned its error */
  TIDE_STEP_INCOMPLETE = 3             /* only with a lost device and gradients_on_gpu
                                          TIDE_GRADIENTS_GPU or resident state: the
                                          `not_updated` subgroups could not be updated (their
                                          gradients were lost), the others were: `reason` */
} tide_step_outcome;

/* Per subgroup, how the step ended for it (tide_step_result.subgroup_outcome). */
enum { TIDE_SUBGROUP_UPDATED = 0, TIDE_SUBGROUP_UNWRITTEN = 1, TIDE_SUBGROUP_NOT_UPDATED = 2 };

/* What a step did: the one result of tide_optimizer_step. Versioned (see the top). The arrays
 * are the caller's (NULL: not wanted), one element per subgroup, filled when the step happened. */
typedef struct tide_step_result {
  size_t struct_size;
  int32_t outcome;    /* a tide_step_outcome */
  int32_t status;     /* TIDE_STEP_NOT_HAPPENED: the error (also the call's return); else TIDE_OK */
  const char* reason; /* what went wrong ("" for TIDE_STEP_COMPLETED): valid until the
                         optimizer's next call */
  uint8_t* subgroup_outcome;       /* in: caller's array; out: TIDE_SUBGROUP_* per subgroup */
  uint8_t* plan_device;            /* in: caller's array; out: 0 CPU, 1 GPU per subgroup */
  tide_subgroup_buffers* buffers;  /* in: caller's array; out: each subgroup's buffers after the
                                      step (tide_optimizer_buffers) */
  tide_placement_policy placement; /* the policy the phase ran under */
  uint64_t headroom_bytes;         /* the headroom it was planned with */
  double seconds;                  /* measured update phase */
  double predicted_seconds;        /* the model's prediction for what ran */
  double all_cpu_seconds;          /* the model's all-CPU prediction */
  double cpu_busy_seconds;         /* the CPU updates' own time */
  uint64_t gpu_subgroups;          /* updated on the GPU */
  uint64_t cpu_subgroups;          /* updated on the CPU, fallbacks included */
  uint64_t fallback_subgroups;     /* planned on the GPU but updated on the CPU: no GPU memory */
  uint64_t gpu_params;
  uint64_t buffers_in_flight;  /* GPU buffers in flight */
  uint64_t gpu_bytes;          /* GPU memory the plan used: buffers and kept gradients */
  uint64_t nonfinite;          /* elements left unchanged: non-finite gradient or update */
  uint64_t headroom_cap;       /* cap on the next plans' headroom after a fallback; 0: none */
  uint64_t rolled_forward;     /* GPU subgroups redone on the CPU after a fault */
  uint64_t unwritten;          /* subgroups whose model parameters could not be written */
  uint64_t not_updated;        /* subgroups that could not be updated */
  uint64_t resident_subgroups; /* after the step, subgroups whose state stays in device memory
                                  (TIDE_RESIDENCY; counted among gpu_subgroups when updated) */
  uint64_t resident_bytes;     /* device memory their state holds */
  /* Since the previous step (its forward and backward passes): resident subgroups tide's
   * allocator took back home because an allocation would have failed, their bytes, and the
   * seconds that took inside those allocations; and allocations tide's allocator served only by
   * giving its cache back to the driver (a synchronize, unmaps, maps again). */
  uint64_t evicted_subgroups;
  uint64_t evicted_bytes;
  double evict_seconds;
  uint64_t cache_releases;
  /* The GPU subgroups' update kernels, copies in and copies out, as their events timed them,
   * summed: each stream's busy time in the phase (beside cpu_busy_seconds). */
  double gpu_busy_seconds;
  double h2d_busy_seconds;
  double d2h_busy_seconds;
  /* Since the previous step: gradient buffers a prepared plan kept on the GPU
   * (gradients_on_gpu) that tide's allocator took back, before any gradient reached them, because
   * an allocation would have failed (a forward pass past the forecast); their subgroups'
   * gradients went to pinned memory, and this step updated those of them still on the GPU side
   * on the CPU. Given back before any resident state. */
  uint64_t withdrawn_gradients;
  uint64_t withdrawn_bytes;
  /* GPU subgroups whose gradient was on the GPU when the step began (kept by a prepared plan:
   * gradients_on_gpu; or a resident subgroup's): their update copied no gradient in. */
  uint64_t kept_gradients;
} tide_step_result;

static inline tide_step_result tide_step_result_default(void) {
  tide_step_result result = TIDE_ZERO_INIT;
  result.struct_size = sizeof(tide_step_result);
  return result;
}

/* One update phase: plans (unless prepared) with the request's headroom, runs the plan, waits
 * for its end (events only), and says how it ended in `result` (required). Elements whose
 * gradient is not finite are never written (their count is in the result); to skip the whole
 * step instead, check tide_optimizer_grad_stats first. Returns TIDE_OK when the step happened
 * (outcome completed, completed after a fault, or incomplete), else the error of what kept it
 * from happening (outcome TIDE_STEP_NOT_HAPPENED; nothing changed): see "A step happens
 * exactly, or not at all" above. */
TIDE_API tide_status tide_optimizer_step(tide_optimizer* optimizer,
                                         const tide_step_request* request,
                                         tide_step_result* result);

/* Writes the model's parameters of every subgroup from its master weights (cast to the
 * parameters' dtype, as a step does; bf16 master weights as they are), synchronously; frozen
 * slices are left alone. */
TIDE_API tide_status tide_optimizer_write_params(tide_optimizer* optimizer);

/* host_params: the gradients of the coming step, one host address per slice in the order given
 * at creation (slice_count as many), each `count` elements of grad_dtype; 0 for a slice without
 * one (it must be frozen: tide_optimizer_set_frozen). Read in place by
 * tide_optimizer_grad_stats and the next tide_optimizer_step, and forgotten when that step
 * returns; the memory must stay as it is until then. */
TIDE_API tide_status tide_optimizer_set_gradients(tide_optimizer* optimizer, const uint64_t* grads,
                                                  size_t slice_count);

/* Frozen slices: frozen[i] (for the i-th slice given to tide_optimizer_create) non-zero means the
 * coming steps leave that slice's elements exactly as they are, state and model parameters (its
 * parameter had no gradient, and torch.optim leaves such parameters untouched). Kept until set
 * again. `slice_count`: as given to tide_optimizer_create. */
TIDE_API tide_status tide_optimizer_set_frozen(tide_optimizer* optimizer, const uint8_t* frozen,
                                               size_t slice_count);

/* Frees the GPU buffers the update phases keep from one phase to the next (the next phase
 * allocates them again). Call after a step when the coming forward pass needs that memory: the
 * headroom is what the update phase may use, not the forward pass. */
TIDE_API tide_status tide_optimizer_release_buffers(tide_optimizer* optimizer);

/* Resident subgroups (TIDE_RESIDENCY, placement auto) keep their state in device memory across
 * steps; their pinned buffers (tide_optimizer_buffers) are then a mirror. This makes every
 * mirror current (a device-to-host copy; synchronous), for reading the state between steps.
 * `written` nonzero: the caller may also write the buffers, which are then the state (the next
 * step copies it in from there). TIDE_ERROR_CUDA when the device fails: the state since the last
 * such call is then on the lost device only. No resident subgroup: returns at once. */
TIDE_API tide_status tide_optimizer_sync_state(tide_optimizer* optimizer, int32_t written);

/* Ends the residency of resident subgroups (their state goes back to their pinned buffers) and
 * frees the device memory it held, the last subgroups first, until at least `max_bytes` were
 * freed (UINT64_MAX: all). `freed` (optional): the bytes freed. Errors as
 * tide_optimizer_sync_state. */
TIDE_API tide_status tide_optimizer_evict(tide_optimizer* optimizer, uint64_t max_bytes,
                                          uint64_t* freed);

/* The last phase's plan as it ran: per subgroup device[i] (0 CPU, 1 GPU) and order[i] (its
 * position in its device's order); `summary` (may be NULL) holds its prediction. */
TIDE_API tide_status tide_optimizer_last_plan(const tide_optimizer* optimizer, uint8_t* device,
                                              uint32_t* order, tide_plan_summary* summary);

/* Measured seconds of each subgroup in the last phase (0 where a stage did not run). */
typedef struct tide_subgroup_timing {
  double cpu_update;
  double h2d;
  double gpu_update;
  double d2h;
} tide_subgroup_timing;

TIDE_API tide_status tide_optimizer_last_timings(const tide_optimizer* optimizer,
                                                 tide_subgroup_timing* timings, size_t count);

/* The rates the next plan uses (refined by the phases so far). */
TIDE_API tide_status tide_optimizer_rates(const tide_optimizer* optimizer, tide_rates* rates);
/* The host memory rates the next plan uses (refined by the phases so far). */
TIDE_API tide_status tide_optimizer_host_memory_rates(const tide_optimizer* optimizer,
                                                      tide_host_memory_rates* rates);

/* How much of the state is held in pageable host memory: the subgroups that could not be pinned
 * (past this rank's share of TIDE_NODE_PINNED_LIMIT, or the host would not pin more), which are
 * updated on the CPU only, and their bytes. Either output may be null. */
TIDE_API tide_status tide_optimizer_pageable(const tide_optimizer* optimizer, size_t* subgroups,
                                             uint64_t* bytes);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_TIDE_H_ */
