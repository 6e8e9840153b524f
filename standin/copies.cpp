#include "standin/copies.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "standin/bandwidth.h"
#include "standin/contexts.h"
#include "standin/device_memory.h"
#include "standin/devices.h"
#include "standin/faults.h"
#include "standin/holds.h"
#include "standin/host_access.h"
#include "standin/host_memory.h"
#include "standin/pending_uses.h"
#include "standin/recording.h"
#include "standin/stats.h"
#include "standin/virtual_memory.h"

namespace tide::standin {
namespace {

enum class Mode { kSync, kAsync };

struct Copy {
  Direction direction;
  void* dst;
  const void* src;
  std::size_t bytes;
};

const char* name(Direction direction) {
  switch (direction) {
    case Direction::kHostToDevice:
      return "a host-to-device copy";
    case Direction::kDeviceToHost:
      return "a device-to-host copy";
    case Direction::kDeviceToDevice:
      break;
  }
  return "a device-to-device copy";
}

// The memory submitted work uses, until the work has run (standin/pending_uses.h), and the staged
// copy of a pageable source.
struct Use {
  std::unique_ptr<PendingUse> use;
  std::vector<unsigned char> staging;
};

unsigned kind_of(Direction direction) {
  switch (direction) {
    case Direction::kHostToDevice:
      return TIDE_STANDIN_OP_H2D;
    case Direction::kDeviceToHost:
      return TIDE_STANDIN_OP_D2H;
    case Direction::kDeviceToDevice:
      break;
  }
  return TIDE_STANDIN_OP_D2D;
}

// The work of one copy on the worker: once any hold lets it start, the memcpy, then, with a
// simulated rate, a sleep until the device's link for that direction would have moved the bytes
// (booked after the hold: a held copy does not occupy the link).
std::function<void()> copy_work(const Copy& copy, Device& device, const std::shared_ptr<Use>& use,
                                RecordedOp recorded) {
  const double bytes_per_s = rate(copy.direction);
  Link* link = copy.direction == Direction::kHostToDevice   ? &device.h2d
               : copy.direction == Direction::kDeviceToHost ? &device.d2h
                                                            : nullptr;
  return [copy, bytes_per_s, link, use, recorded] {
    pass_hold(kind_of(copy.direction));
    recorded.started();
    const auto done = bytes_per_s > 0 && link != nullptr ? link->book(copy.bytes, bytes_per_s)
                                                         : Link::Clock::time_point{};
    std::memmove(copy.dst, use->staging.empty() ? copy.src : use->staging.data(), copy.bytes);
    use->use.reset();
    std::this_thread::sleep_until(done);
    recorded.ended();
  };
}

CUresult submit_copy(const Copy& copy, Mode mode, CUstream handle, DefaultStream fallback) {
  std::shared_ptr<Stream> stream;
  if (mode == Mode::kSync) {
    // A synchronous copy needs a current context and goes through its default stream.
    Context* context = nullptr;
    if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
    handle = nullptr;
  }
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  if (copy.bytes == 0) return CUDA_SUCCESS;
  const auto dst = reinterpret_cast<std::uintptr_t>(copy.dst);
  const auto src = reinterpret_cast<std::uintptr_t>(copy.src);
  // Registered before the checks: memory unmapped after them is caught at the unmap.
  auto use = std::make_shared<Use>();
  use->use = std::make_unique<PendingUse>(
      std::vector<UsedRange>{{dst, copy.bytes}, {src, copy.bytes}},
      std::string(name(copy.direction)) + " of " + std::to_string(copy.bytes) + " bytes");
  const bool host_dst = copy.direction == Direction::kDeviceToHost;
  const bool host_src = copy.direction == Direction::kHostToDevice;
  if ((host_dst ? dst == 0 : !is_device_range(dst, copy.bytes, true)) ||
      (host_src ? src == 0 : !is_device_range(src, copy.bytes, false))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The device may only read host memory registered read-only.
  if (PinnedRange pinned; host_dst && find_page_locked(copy.dst, &pinned) && pinned.read_only) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (inject_copy_failure()) return CUDA_ERROR_LAUNCH_FAILED;

  bool wait = mode == Mode::kSync;
  if (mode == Mode::kAsync && (host_dst || host_src)) {
    const void* host = host_dst ? copy.dst : copy.src;
    if (!is_page_locked(host, copy.bytes)) {
      count(Counter::kPageableAsyncCopies);
      if (host_dst) {
        wait = true;  // as CUDA: it returns once the copy is complete
      } else {
        // As CUDA: the stream's earlier work first, then the source is staged and the call
        // returns; the copy to the device comes later, in stream order.
        const Position tail = stream->timeline()->tail();
        tail.timeline->wait(tail.seq);
        const auto* first = static_cast<const unsigned char*>(copy.src);
        use->staging.assign(first, first + copy.bytes);
      }
    }
  }
  switch (copy.direction) {
    case Direction::kHostToDevice:
      count(Counter::kCopiesH2D);
      count(Counter::kBytesH2D, copy.bytes);
      break;
    case Direction::kDeviceToHost:
      count(Counter::kCopiesD2H);
      count(Counter::kBytesD2H, copy.bytes);
      break;
    case Direction::kDeviceToDevice:
      count(Counter::kCopiesD2D);
      count(Counter::kBytesD2D, copy.bytes);
      break;
  }
  Device& device = *find_device(stream->context().device());
  tide_standin_op op{};
  op.kind = kind_of(copy.direction);
  op.device = stream->context().device();
  op.stream = stream->id();
  op.dst = dst;
  op.src = src;
  op.bytes = copy.bytes;
  const Position position = stream->submit(copy_work(copy, device, use, record_submission(op)));
  if (wait) position.timeline->wait(position.seq);
  return CUDA_SUCCESS;
}

void* host_pointer(CUdeviceptr ptr) { return reinterpret_cast<void*>(ptr); }

}  // namespace

bool is_device_range(std::uintptr_t ptr, std::size_t bytes, bool write) {
  if (ptr == 0) return false;
  if (in_allocation(ptr, bytes) || vmm_accessible(ptr, bytes, write)) return true;
  // HMM: other memory is the process's own, except device memory overrun (a fault) and address
  // space reserved for device mappings, which is not host memory.
  Allocation a;
  return host_addressable() && !find_allocation(ptr, &a) && !find_allocation(ptr + bytes - 1, &a) &&
         !overlaps_reservation(ptr, bytes);
}

CUresult copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes,
                        DefaultStream fallback) {
  return submit_copy(Copy{Direction::kHostToDevice, host_pointer(dst), src, bytes}, Mode::kSync,
                     nullptr, fallback);
}

CUresult copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes, DefaultStream fallback) {
  return submit_copy(Copy{Direction::kDeviceToHost, dst, host_pointer(src), bytes}, Mode::kSync,
                     nullptr, fallback);
}

CUresult copy_to_device_async(CUdeviceptr dst, const void* src, std::size_t bytes, CUstream stream,
                              DefaultStream fallback) {
  return submit_copy(Copy{Direction::kHostToDevice, host_pointer(dst), src, bytes}, Mode::kAsync,
                     stream, fallback);
}

CUresult copy_to_host_async(void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream,
                            DefaultStream fallback) {
  return submit_copy(Copy{Direction::kDeviceToHost, dst, host_pointer(src), bytes}, Mode::kAsync,
                     stream, fallback);
}

CUresult copy_on_device_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream,
                              DefaultStream fallback) {
  return submit_copy(Copy{Direction::kDeviceToDevice, host_pointer(dst), host_pointer(src), bytes},
                     Mode::kAsync, stream, fallback);
}

CUresult memset_d8_async(CUdeviceptr dst, unsigned char value, std::size_t bytes, CUstream handle,
                         DefaultStream fallback) {
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  if (bytes == 0) return CUDA_SUCCESS;
  auto use = std::make_shared<Use>();
  use->use = std::make_unique<PendingUse>(std::vector<UsedRange>{{dst, bytes}},
                                          "a memset of " + std::to_string(bytes) + " bytes");
  if (!is_device_range(dst, bytes, true)) return CUDA_ERROR_INVALID_VALUE;
  stream->submit([p = host_pointer(dst), value, bytes, use] {
    std::memset(p, value, bytes);
    use->use.reset();
  });
  count(Counter::kMemsets);
  return CUDA_SUCCESS;
}

}  // namespace tide::standin
