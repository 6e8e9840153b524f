#include "driver/stream.h"

#include <memory>
#include <utility>

#include "driver/context.h"
#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::driver {
namespace {

// Answers "is it done yet?" from a query call: CUDA_ERROR_NOT_READY means no, anything else
// but success is an error.
bool ready(CUresult result, const char* call) {
  if (result == CUDA_ERROR_NOT_READY) return false;
  check(result, call);
  return true;
}

}  // namespace

Stream::Stream() : context_(current_context()) {
  TIDE_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
}

Stream::~Stream() {
  if (stream_ != nullptr) destroy_in(context_, [this] { cuda().cuStreamDestroy(stream_); });
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), context_(other.context_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  std::swap(stream_, other.stream_);
  std::swap(context_, other.context_);
  return *this;
}

void Stream::synchronize() const { TIDE_CU(cuStreamSynchronize, stream_); }

bool Stream::idle() const { return ready(cuda().cuStreamQuery(stream_), "cuStreamQuery"); }

void Stream::wait(const Event& event) const { TIDE_CU(cuStreamWaitEvent, stream_, event.get(), 0); }

void Stream::host_callback(std::function<void()> fn) const {
  auto owned = std::make_unique<std::function<void()>>(std::move(fn));
  auto trampoline = [](void* data) {
    std::unique_ptr<std::function<void()>> callback(static_cast<std::function<void()>*>(data));
    (*callback)();
  };
  TIDE_CU(cuLaunchHostFunc, stream_, trampoline, owned.get());
  static_cast<void>(owned.release());  // the trampoline owns it now
}

Event::Event(Timing timing) : context_(current_context()) {
  TIDE_CU(cuEventCreate, &event_,
          timing == Timing::kEnabled ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING);
}

Event::~Event() {
  if (event_ != nullptr) destroy_in(context_, [this] { cuda().cuEventDestroy(event_); });
}

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), context_(other.context_) {}

Event& Event::operator=(Event&& other) noexcept {
  std::swap(event_, other.event_);
  std::swap(context_, other.context_);
  return *this;
}

void Event::record(const Stream& stream) { record(stream.get()); }

void Event::record(CUstream stream) { TIDE_CU(cuEventRecord, event_, stream); }

bool Event::done() const { return ready(cuda().cuEventQuery(event_), "cuEventQuery"); }

void Event::synchronize() const { TIDE_CU(cuEventSynchronize, event_); }

float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  TIDE_CU(cuEventElapsedTime, &ms, start.event_, event_);
  return ms;
}

}  // namespace tide::driver
