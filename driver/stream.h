// A non-blocking stream, and an event recorded on streams.
#pragma once

#include <cuda.h>

#include <functional>

namespace tide::driver {

class Event;

// Streams and events belong to the context current when they are made (it must stay alive while
// they do); they are destroyed in it, on whatever thread lets them go.
class Stream {
 public:
  Stream();  // CU_STREAM_NON_BLOCKING: never serialised with the legacy default stream
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void synchronize() const;
  // True when all work submitted so far has completed.
  bool idle() const;
  // Work submitted after this call waits for `event`'s recorded work.
  void wait(const Event& event) const;
  // Runs `fn` on a driver thread once prior work completes; it must not call the driver.
  void host_callback(std::function<void()> fn) const;

  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
  CUcontext context_ = nullptr;
};

class Event {
 public:
  // Timing events record times for elapsed_ms(); plain ones are cheaper to record and wait on.
  enum class Timing { kDisabled, kEnabled };
  explicit Event(Timing timing = Timing::kDisabled);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void record(CUstream stream);
  bool done() const;
  void synchronize() const;
  // Milliseconds between `start` and this event; both must be timing events.
  float elapsed_ms(const Event& start) const;

  CUevent get() const { return event_; }

 private:
  CUevent event_ = nullptr;
  CUcontext context_ = nullptr;
};

}  // namespace tide::driver
