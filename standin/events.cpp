#include "standin/events.h"

#include <mutex>
#include <unordered_map>
#include <utility>

#include "standin/contexts.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

struct Event {
  const Context* context;
  unsigned flags;
  std::mutex mutex;
  std::shared_ptr<EventRecord> last;  // null: never recorded
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<CUevent, std::shared_ptr<Event>> events;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

std::shared_ptr<Event> find(CUevent handle) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.events.find(handle);
  return it == r.events.end() ? nullptr : it->second;
}

std::shared_ptr<EventRecord> record_of(Event& event) {
  const std::lock_guard lock(event.mutex);
  return event.last;
}

bool done(const EventRecord& record) {
  return record.position.timeline->reached(record.position.seq);
}

}  // namespace

CUresult event_create(CUevent* out, unsigned flags) {
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (out == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  // As in CUDA: an interprocess event must not be a timing event.
  if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  auto event = std::make_shared<Event>();
  event->context = context;
  event->flags = flags;
  const auto handle = reinterpret_cast<CUevent>(event.get());
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.events.emplace(handle, std::move(event));
  *out = handle;
  count(Counter::kEventsCreated);
  return CUDA_SUCCESS;
}

CUresult event_destroy(CUevent handle) {
  // Recorded work keeps its record alive: destroying an event with work pending is fine.
  std::shared_ptr<Event> event;
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.events.find(handle);
  if (it == r.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  event = std::move(it->second);
  r.events.erase(it);
  count(Counter::kEventsDestroyed);
  return CUDA_SUCCESS;
}

CUresult event_record(CUevent handle, CUstream stream_handle, DefaultStream fallback) {
  const auto event = find(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(stream_handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  // As CUDA: "hEvent and hStream must be from the same context".
  if (&stream->context() != event->context) return CUDA_ERROR_INVALID_HANDLE;
  auto record = std::make_shared<EventRecord>();
  // The marker stamps the time when the stream reaches it: the completion of the work before.
  record->position = stream->submit([record] { record->time = std::chrono::steady_clock::now(); });
  const std::lock_guard lock(event->mutex);
  event->last = std::move(record);
  return CUDA_SUCCESS;
}

CUresult event_query(CUevent handle) {
  const auto event = find(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  const auto record = record_of(*event);
  return !record || done(*record) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult event_synchronize(CUevent handle) {
  const auto event = find(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (const auto record = record_of(*event)) {
    record->position.timeline->wait(record->position.seq);
  }
  return CUDA_SUCCESS;
}

CUresult event_elapsed_time(float* ms, CUevent start_handle, CUevent end_handle) {
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto start = find(start_handle);
  const auto end = find(end_handle);
  if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
  if (((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) != 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  const auto first = record_of(*start);
  const auto second = record_of(*end);
  if (!first || !second) return CUDA_ERROR_INVALID_HANDLE;  // never recorded, as in CUDA
  if (!done(*first) || !done(*second)) return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(second->time - first->time).count();
  return CUDA_SUCCESS;
}

CUresult last_record(CUevent handle, std::shared_ptr<EventRecord>* out) {
  const auto event = find(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  *out = record_of(*event);
  return CUDA_SUCCESS;
}

void destroy_events_of(const Context& context) {
  std::vector<std::shared_ptr<Event>> doomed;
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::erase_if(r.events, [&](auto& entry) {
    if (entry.second->context != &context) return false;
    doomed.push_back(std::move(entry.second));
    return true;
  });
}

}  // namespace tide::standin
