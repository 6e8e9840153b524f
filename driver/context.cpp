#include "driver/context.h"

#include <unistd.h>

#include <map>
#include <mutex>

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::driver {

int device_count() {
  int count = 0;
  TIDE_CU(cuDeviceGetCount, &count);
  return count;
}

std::string device_name(int device) {
  CUdevice handle = 0;
  TIDE_CU(cuDeviceGet, &handle, device);
  char name[256] = {};
  TIDE_CU(cuDeviceGetName, name, static_cast<int>(sizeof name), handle);
  return name;
}

MemoryInfo memory_info() {
  MemoryInfo info{};
  TIDE_CU(cuMemGetInfo, &info.free_bytes, &info.total_bytes);
  return info;
}

// tide's one reference to a device's primary context: retained when made, released when the last
// share goes.
struct PrimaryContext::Reference {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;
  pid_t retained_by = 0;

  Reference(const Reference&) = delete;
  Reference& operator=(const Reference&) = delete;

  explicit Reference(int device_ordinal) : ordinal(device_ordinal), retained_by(getpid()) {
    TIDE_CU(cuDeviceGet, &device, device_ordinal);
    TIDE_CU(cuDevicePrimaryCtxRetain, &context, device);
  }
  ~Reference() {
    // A child forked from the process that retained holds no reference of its own to release.
    if (getpid() != retained_by) return;
    report(cuda().cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease");
  }
};

namespace {

// The live reference of each device, if any. Never destroyed: shares may outlive static
// destruction (objects that die at exit).
struct Registry {
  std::mutex mutex;
  std::map<int, std::weak_ptr<const void>> references;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

}  // namespace

PrimaryContext::PrimaryContext(int device) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::weak_ptr<const void>& slot = r.references[device];
  reference_ = std::static_pointer_cast<const Reference>(slot.lock());
  if (!reference_) {
    reference_ = std::make_shared<const Reference>(device);
    slot = reference_;
  }
}

int PrimaryContext::device() const { return reference_->ordinal; }

CUcontext PrimaryContext::get() const { return reference_->context; }

CUcontext current_context() {
  CUcontext current = nullptr;
  TIDE_CU(cuCtxGetCurrent, &current);
  return current;
}

ContextScope::ContextScope(CUcontext context) {
  if (current_context() == context) return;
  TIDE_CU(cuCtxPushCurrent, context);
  pushed_ = context;
}

ContextScope::~ContextScope() {
  if (pushed_ == nullptr) return;
  CUcontext popped = nullptr;
  const CUresult r = cuda().cuCtxPopCurrent(&popped);
  report(r, "cuCtxPopCurrent");
  if (r == CUDA_SUCCESS && popped != pushed_) {
    // Something inside the scope changed the thread's stack without undoing it: a bug in tide.
    report(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent (not the context tide pushed)");
  }
}

void bind_this_thread(CUcontext context) { TIDE_CU(cuCtxSetCurrent, context); }

}  // namespace tide::driver
