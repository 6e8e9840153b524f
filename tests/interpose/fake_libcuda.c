/* A tiny stand-in libcuda.so.1 for the interposer's tests: exact versioned-symbol behaviour, no
 * real memory.
 *
 * It exports, like the NVIDIA driver, the legacy names (cuMemAlloc: the CUDA 3.1 ABI with 32-bit
 * sizes), the versioned ones (cuMemAlloc_v2), the per-thread-stream variants (_ptsz) and both
 * cuGetProcAddress ABIs, which resolve a base name by the caller's cudaVersion and flags. Every
 * function records its exact name (fakecuda_last_call), so a test can see which versioned
 * function a hook really reached. One made-up future ABI, "cuMemAlloc" from cudaVersion 14000
 * (cuMemAlloc_v3, with an extra argument), checks that the interposer never binds a hook to an
 * ABI newer than it knows.
 *
 * Device memory is only address space: allocations get addresses from reused slots, are
 * checked on release, and count against a capacity (FAKECUDA_MEMORY bytes, default 8 GiB). */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

static __thread const char* last_call = "";
static __thread int current_device = 0;
static unsigned long call_count = 0;

#define RECORD(name)                                      \
  do {                                                    \
    last_call = name;                                     \
    __atomic_add_fetch(&call_count, 1, __ATOMIC_RELAXED); \
  } while (0)

FAKE_EXPORT const char* fakecuda_last_call(void) { return last_call; }
FAKE_EXPORT unsigned long fakecuda_call_count(void) {
  return __atomic_load_n(&call_count, __ATOMIC_RELAXED);
}
/* The device cuCtxGetDevice reports on this thread (two devices exist); -1: the thread has no
 * current context (cuCtxGetCurrent gives NULL, context calls fail with INVALID_CONTEXT). */
FAKE_EXPORT void fakecuda_set_device(int device) { current_device = device; }
/* Calls of cuCtxGetDevice made with no current context (the NVIDIA driver reports each as an
 * API error to debuggers and tools). */
static unsigned long calls_without_context = 0;
FAKE_EXPORT unsigned long fakecuda_calls_without_context(void) {
  return __atomic_load_n(&calls_without_context, __ATOMIC_RELAXED);
}

/* ---- Memory: addresses, sizes, capacity ------------------------------------------------------ */

/* Allocations live in slots, reused last-freed-first (cache-friendly, so a benchmark over the
 * stand-in measures the interposer, not the stand-in's cache misses). Slot s has the device
 * address kAddressBase + s * kAddressStride, or the handle kHandleBase + s. */
#define SLOTS (1u << 16)
static const uint64_t kAddressBase = 1ull << 44;
static const uint64_t kAddressStride = 1ull << 28;
static const uint64_t kHandleBase = 0x1000;
struct entry {
  uint64_t key; /* 0: free */
  uint64_t bytes;
  int device;
};
static struct entry table[SLOTS];
static uint32_t free_slots[SLOTS];
static uint32_t free_count;
static int table_ready;
static pthread_mutex_t table_mutex = PTHREAD_MUTEX_INITIALIZER;
static uint64_t used[2];

/* fork(): the table's lock is held across it, so a child never inherits it locked (the tests
 * allocate in children forked while other threads allocate). */
static void lock_table(void) { pthread_mutex_lock(&table_mutex); }
static void unlock_table(void) { pthread_mutex_unlock(&table_mutex); }
__attribute__((constructor)) static void register_fork_handlers(void) {
  pthread_atfork(lock_table, unlock_table, unlock_table);
}

static uint64_t capacity(void) {
  static uint64_t value;
  if (value == 0) {
    const char* text = getenv("FAKECUDA_MEMORY");
    value = text != NULL ? strtoull(text, NULL, 10) : (8ull << 30);
  }
  return value;
}

/* Adds an allocation of `bytes`: its key is its slot's address (or handle when `handle`). */
static CUresult insert(uint64_t bytes, int device, int handle, uint64_t* key_out) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&table_mutex);
  if (!table_ready) {
    for (uint32_t i = 0; i < SLOTS; ++i) free_slots[i] = SLOTS - 1 - i;
    free_count = SLOTS;
    table_ready = 1;
  }
  if (used[device] + bytes > capacity() || free_count == 0) {
    pthread_mutex_unlock(&table_mutex);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const uint32_t slot = free_slots[--free_count];
  const uint64_t key = handle ? kHandleBase + slot : kAddressBase + slot * kAddressStride;
  table[slot].key = key;
  table[slot].bytes = bytes;
  table[slot].device = device;
  used[device] += bytes;
  pthread_mutex_unlock(&table_mutex);
  *key_out = key;
  return CUDA_SUCCESS;
}

static CUresult erase(uint64_t key) {
  uint64_t slot = SLOTS;
  if (key >= kAddressBase && (key - kAddressBase) % kAddressStride == 0) {
    slot = (key - kAddressBase) / kAddressStride;
  } else if (key >= kHandleBase && key < kHandleBase + SLOTS) {
    slot = key - kHandleBase;
  }
  if (slot >= SLOTS) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&table_mutex);
  if (table[slot].key != key) {
    pthread_mutex_unlock(&table_mutex);
    return CUDA_ERROR_INVALID_VALUE;
  }
  used[table[slot].device] -= table[slot].bytes;
  table[slot].key = 0;
  free_slots[free_count++] = (uint32_t)slot;
  pthread_mutex_unlock(&table_mutex);
  return CUDA_SUCCESS;
}

static CUresult alloc_v2(CUdeviceptr* dptr, size_t bytes) {
  if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
  uint64_t key = 0;
  const CUresult r = insert(bytes, current_device, 0, &key);
  if (r == CUDA_SUCCESS) *dptr = key;
  return r;
}

/* FAKECUDA_TRACE=1: every lookup on stderr (to see what a real runtime asks for). */
static void trace(const char* api, const char* symbol, int cuda_version, cuuint64_t flags) {
  if (getenv("FAKECUDA_TRACE") != NULL) {
    fprintf(stderr, "fakecuda: %s(%s, %d, %llu)\n", api, symbol != NULL ? symbol : "(null)",
            cuda_version, (unsigned long long)flags);
  }
}

/* ---- Initialisation and devices -------------------------------------------------------------- */

FAKE_EXPORT CUresult cuInit(unsigned int flags) {
  RECORD("cuInit");
  return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
  RECORD("cuDriverGetVersion");
  if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  RECORD("cuDeviceGetCount");
  if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
  *count = 2;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  RECORD("cuDeviceGet");
  if (device == NULL || ordinal < 0 || ordinal > 1) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  /* Not recorded: the interposer calls it from inside its hooks. */
  if (current_device < 0) {
    __atomic_add_fetch(&calls_without_context, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  *device = current_device;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* context) {
  /* Not recorded: the interposer calls it from inside its hooks. */
  if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
  *context = current_device < 0 ? NULL : (CUcontext)(uintptr_t)(0x1000 + current_device);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  RECORD("cuGetErrorName");
  if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS:
      *name = "CUDA_SUCCESS";
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case CUDA_ERROR_INVALID_VALUE:
      *name = "CUDA_ERROR_INVALID_VALUE";
      break;
    default:
      *name = "CUDA_ERROR_UNKNOWN";
      break;
  }
  return CUDA_SUCCESS;
}

/* cuGetExportTable: private tables the runtime asks for. The interposer must pass it through
 * untouched; the fake returns a recognisable table for any id. */
FAKE_EXPORT const void* fakecuda_export_table[4] = {0};
FAKE_EXPORT CUresult cuGetExportTable(const void** table_out, const CUuuid* id) {
  RECORD("cuGetExportTable");
  trace("cuGetExportTable", "", 0, 0);
  if (table_out == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
  *table_out = fakecuda_export_table;
  return CUDA_SUCCESS;
}

/* ---- Memory information ---------------------------------------------------------------------- */

FAKE_EXPORT CUresult cuMemGetInfo(unsigned int* free_bytes, unsigned int* total) {
  RECORD("cuMemGetInfo");
  if (free_bytes == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
  *total = 0xffffffffu;
  *free_bytes = 0xffffffffu;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  RECORD("cuMemGetInfo_v2");
  if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (free_bytes == NULL && total == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&table_mutex);
  const uint64_t in_use = used[current_device];
  pthread_mutex_unlock(&table_mutex);
  if (total != NULL) *total = capacity();
  if (free_bytes != NULL) *free_bytes = capacity() - in_use;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice device) {
  RECORD("cuDeviceTotalMem");
  if (bytes == NULL || device < 0 || device > 1) return CUDA_ERROR_INVALID_VALUE;
  *bytes = 0xffffffffu;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  RECORD("cuDeviceTotalMem_v2");
  if (bytes == NULL || device < 0 || device > 1) return CUDA_ERROR_INVALID_VALUE;
  *bytes = capacity();
  return CUDA_SUCCESS;
}

/* ---- Allocation ------------------------------------------------------------------------------ */

FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytes) {
  RECORD("cuMemAlloc");
  CUdeviceptr wide = 0;
  const CUresult r = alloc_v2(dptr != NULL ? &wide : NULL, bytes);
  if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr_v1)(wide & 0xffffffffu);
  return r;
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  RECORD("cuMemAlloc_v2");
  return alloc_v2(dptr, bytes);
}

/* The made-up future ABI: what "cuMemAlloc" resolves to from cudaVersion 14000. */
FAKE_EXPORT CUresult cuMemAlloc_v3(CUdeviceptr* dptr, size_t bytes, unsigned long long flags) {
  RECORD("cuMemAlloc_v3");
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return alloc_v2(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch, unsigned int width,
                                     unsigned int height, unsigned int element) {
  RECORD("cuMemAllocPitch");
  (void)dptr, (void)pitch, (void)width, (void)height, (void)element;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                        size_t height, unsigned int element) {
  RECORD("cuMemAllocPitch_v2");
  if (pitch == NULL || element == 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t padded = (width + 511) & ~(size_t)511;
  const CUresult r = alloc_v2(dptr, padded * height);
  if (r == CUDA_SUCCESS) *pitch = padded;
  return r;
}

FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  RECORD("cuMemAllocManaged");
  (void)flags;
  return alloc_v2(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
  RECORD("cuMemFree");
  (void)dptr;
  return CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  RECORD("cuMemFree_v2");
  return erase(dptr);
}

/* ---- Stream-ordered allocation (legacy and per-thread default stream) ------------------------ */

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  RECORD("cuMemAllocAsync");
  (void)stream;
  return alloc_v2(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  RECORD("cuMemAllocAsync_ptsz");
  (void)stream;
  return alloc_v2(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  RECORD("cuMemFreeAsync");
  (void)stream;
  return erase(dptr);
}

FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  RECORD("cuMemFreeAsync_ptsz");
  (void)stream;
  return erase(dptr);
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream) {
  RECORD("cuMemAllocFromPoolAsync");
  (void)pool, (void)stream;
  return alloc_v2(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes,
                                                  CUmemoryPool pool, CUstream stream) {
  RECORD("cuMemAllocFromPoolAsync_ptsz");
  (void)pool, (void)stream;
  return alloc_v2(dptr, bytes);
}

/* ---- Virtual memory -------------------------------------------------------------------------- */

FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                         CUdeviceptr addr, unsigned long long flags) {
  RECORD("cuMemAddressReserve");
  (void)alignment, (void)addr, (void)flags;
  if (ptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  /* Reserved ranges come from their own region: only cuMemMap uses them. */
  static uint64_t next_reserved = 1ull << 46;
  *ptr = __atomic_fetch_add(&next_reserved, (size + 511) & ~(size_t)511, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  RECORD("cuMemAddressFree");
  return ptr != 0 && size != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                 const CUmemAllocationProp* prop, unsigned long long flags) {
  RECORD("cuMemCreate");
  if (handle == NULL || prop == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const int device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : 0;
  if (device < 0 || device > 1) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t key = 0;
  const CUresult r = insert(size, device, 1, &key);
  if (r == CUDA_SUCCESS) *handle = key;
  return r;
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  RECORD("cuMemRelease");
  return erase(handle);
}

FAKE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags) {
  RECORD("cuMemMap");
  (void)offset;
  return ptr != 0 && size != 0 && handle > 1 && flags == 0 ? CUDA_SUCCESS
                                                           : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  RECORD("cuMemUnmap");
  return ptr != 0 && size != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGetProcAddress ------------------------------------------------------------------------ */

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status);

struct proc {
  const char* symbol; /* base name */
  int since;          /* the cudaVersion from which this function is returned */
  int per_thread;     /* returned for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
  void* fn;
};

#define PROC(name, since, per_thread, fn) \
  { name, since, per_thread, (void*)&fn }
static const struct proc procs[] = {
    PROC("cuInit", 2000, 0, cuInit),
    PROC("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
    PROC("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
    PROC("cuDeviceGet", 2000, 0, cuDeviceGet),
    PROC("cuCtxGetDevice", 2000, 0, cuCtxGetDevice),
    PROC("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
    PROC("cuGetErrorName", 6000, 0, cuGetErrorName),
    PROC("cuGetExportTable", 3000, 0, cuGetExportTable),
    PROC("cuMemGetInfo", 2000, 0, cuMemGetInfo),
    PROC("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2),
    PROC("cuDeviceTotalMem", 2000, 0, cuDeviceTotalMem),
    PROC("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
    PROC("cuMemAlloc", 2000, 0, cuMemAlloc),
    PROC("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
    PROC("cuMemAlloc", 14000, 0, cuMemAlloc_v3),
    PROC("cuMemAllocPitch", 2000, 0, cuMemAllocPitch),
    PROC("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2),
    PROC("cuMemAllocManaged", 6000, 0, cuMemAllocManaged),
    PROC("cuMemFree", 2000, 0, cuMemFree),
    PROC("cuMemFree", 3020, 0, cuMemFree_v2),
    PROC("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
    PROC("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
    PROC("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
    PROC("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
    PROC("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync),
    PROC("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    PROC("cuMemAddressReserve", 10020, 0, cuMemAddressReserve),
    PROC("cuMemAddressFree", 10020, 0, cuMemAddressFree),
    PROC("cuMemCreate", 10020, 0, cuMemCreate),
    PROC("cuMemRelease", 10020, 0, cuMemRelease),
    PROC("cuMemMap", 10020, 0, cuMemMap),
    PROC("cuMemUnmap", 10020, 0, cuMemUnmap),
    PROC("cuGetProcAddress", 11030, 0, cuGetProcAddress),
    PROC("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
};

static const struct proc* find_proc(const char* symbol, int cuda_version, cuuint64_t flags,
                                    int* exists) {
  const int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const struct proc* best = NULL;
  *exists = 0;
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; ++i) {
    const struct proc* p = &procs[i];
    if (strcmp(p->symbol, symbol) != 0) continue;
    *exists = 1;
    if (p->since > cuda_version) continue;
    /* A per-thread variant wins for per-thread callers; legacy callers never get one. */
    if (p->per_thread && !per_thread) continue;
    if (best == NULL || p->since > best->since || (p->since == best->since && p->per_thread)) {
      best = p;
    }
  }
  return best;
}

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  RECORD("cuGetProcAddress_v2");
  trace("cuGetProcAddress_v2", symbol, cuda_version, flags);
  if (symbol == NULL || pfn == NULL || flags > 2) return CUDA_ERROR_INVALID_VALUE;
  int exists = 0;
  const struct proc* p = find_proc(symbol, cuda_version, flags, &exists);
  *pfn = p != NULL ? p->fn : NULL;
  if (status != NULL) {
    *status = p != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
              : exists  ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                        : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

#undef cuGetProcAddress
FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                      cuuint64_t flags) {
  RECORD("cuGetProcAddress");
  trace("cuGetProcAddress", symbol, cuda_version, flags);
  if (symbol == NULL || pfn == NULL || flags > 2) return CUDA_ERROR_INVALID_VALUE;
  int exists = 0;
  const struct proc* p = find_proc(symbol, cuda_version, flags, &exists);
  *pfn = p != NULL ? p->fn : NULL;
  return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* ---- For the tests: the real address of an exported function, bypassing dlsym --------------- */

#define FN(name) \
  { #name, (void*)&name }
static const struct {
  const char* name;
  void* fn;
} functions[] = {
    FN(cuInit),
    FN(cuDriverGetVersion),
    FN(cuDeviceGetCount),
    FN(cuDeviceGet),
    FN(cuCtxGetDevice),
    FN(cuCtxGetCurrent),
    FN(cuGetErrorName),
    FN(cuGetExportTable),
    FN(cuMemGetInfo),
    FN(cuMemGetInfo_v2),
    FN(cuDeviceTotalMem),
    FN(cuDeviceTotalMem_v2),
    FN(cuMemAlloc),
    FN(cuMemAlloc_v2),
    FN(cuMemAlloc_v3),
    FN(cuMemAllocPitch),
    FN(cuMemAllocPitch_v2),
    FN(cuMemAllocManaged),
    FN(cuMemFree),
    FN(cuMemFree_v2),
    FN(cuMemAllocAsync),
    FN(cuMemAllocAsync_ptsz),
    FN(cuMemFreeAsync),
    FN(cuMemFreeAsync_ptsz),
    FN(cuMemAllocFromPoolAsync),
    FN(cuMemAllocFromPoolAsync_ptsz),
    FN(cuMemAddressReserve),
    FN(cuMemAddressFree),
    FN(cuMemCreate),
    FN(cuMemRelease),
    FN(cuMemMap),
    FN(cuMemUnmap),
    FN(cuGetProcAddress),
    FN(cuGetProcAddress_v2),
};

FAKE_EXPORT void* fakecuda_function(const char* name) {
  for (size_t i = 0; i < sizeof functions / sizeof functions[0]; ++i) {
    if (strcmp(functions[i].name, name) == 0) return functions[i].fn;
  }
  return NULL;
}
