#include "standin/streams.h"

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "standin/contexts.h"
#include "standin/events.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

// The streams cuStreamCreate made, by handle. A stream lives while it is here or while a call
// that found it is still using it. Handles are never reused, so that a stream used after its
// destruction is told apart from a live one (and counted), where CUDA may hand the same address
// to a new stream.
struct Registry {
  std::mutex mutex;
  std::unordered_map<CUstream, std::shared_ptr<Stream>> streams;
  std::uintptr_t made = 0;  // handles handed out: kFirstHandle + kHandleStep * [1, made]
};

constexpr std::uintptr_t kFirstHandle = std::uintptr_t{0x57} << 40;
constexpr std::uintptr_t kHandleStep = 64;

bool was_made(const Registry& r, CUstream handle) {
  const auto h = reinterpret_cast<std::uintptr_t>(handle);
  return h > kFirstHandle && (h - kFirstHandle) % kHandleStep == 0 &&
         (h - kFirstHandle) / kHandleStep <= r.made;
}

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

// Set on a stream worker while it runs a host function (cuLaunchHostFunc).
thread_local bool t_in_host_function = false;

}  // namespace

bool in_host_function() { return t_in_host_function; }

Stream::Stream(Context& context, Kind kind)
    : context_(context), kind_(kind), timeline_(Timeline::start(kind != Kind::kNonBlocking)) {}

Stream::~Stream() { timeline_->close(); }

Position Stream::submit(std::function<void()> work, std::vector<Position> deps) {
  return context_.submit(*this, std::move(work), std::move(deps));
}

CUresult resolve_stream(CUstream handle, DefaultStream fallback, std::shared_ptr<Stream>* out) {
  if (handle == nullptr) {
    handle = fallback == DefaultStream::kLegacy ? CU_STREAM_LEGACY : CU_STREAM_PER_THREAD;
  }
  if (handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    Context* context = nullptr;
    if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
    *out = handle == CU_STREAM_LEGACY ? context->legacy_stream() : context->per_thread_stream();
    // Null only if the context was destroyed since current_context() looked.
    return *out ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.streams.find(handle);
  if (it == r.streams.end()) {
    if (was_made(r, handle)) count(Counter::kDestroyedStreamUses);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *out = it->second;
  return CUDA_SUCCESS;
}

CUresult stream_create(CUstream* out, unsigned flags) {
  if (out == nullptr || (flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  auto stream = context->create_stream(
      (flags & CU_STREAM_NON_BLOCKING) != 0 ? Stream::Kind::kNonBlocking : Stream::Kind::kBlocking);
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto handle = reinterpret_cast<CUstream>(kFirstHandle + kHandleStep * ++r.made);
  stream->set_handle(handle);
  r.streams.emplace(handle, std::move(stream));
  *out = handle;
  return CUDA_SUCCESS;
}

CUresult stream_destroy(CUstream handle) {
  std::shared_ptr<Stream> stream;  // dropped after the lock: closing it takes the stream's lock
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.streams.find(handle);
  if (it == r.streams.end()) {
    if (was_made(r, handle)) count(Counter::kDestroyedStreamUses);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  stream = std::move(it->second);
  r.streams.erase(it);
  return CUDA_SUCCESS;
}

CUresult stream_synchronize(CUstream handle, DefaultStream fallback) {
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  const Position tail = stream->timeline()->tail();
  tail.timeline->wait(tail.seq);
  return CUDA_SUCCESS;
}

CUresult stream_query(CUstream handle, DefaultStream fallback) {
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  return stream->timeline()->idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult stream_wait_event(CUstream handle, CUevent event, unsigned flags, DefaultStream fallback) {
  if ((flags & ~unsigned{CU_EVENT_WAIT_EXTERNAL}) != 0) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  std::shared_ptr<EventRecord> record;
  if (CUresult r = last_record(event, &record); r != CUDA_SUCCESS) return r;
  if (!record) return CUDA_SUCCESS;  // never recorded: nothing to wait for, as in CUDA
  stream->submit({}, {record->position});
  return CUDA_SUCCESS;
}

CUresult launch_host_func(CUstream handle, CUhostFn fn, void* data, DefaultStream fallback) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  stream->submit([fn, data] {
    t_in_host_function = true;
    fn(data);
    t_in_host_function = false;
  });
  count(Counter::kHostFuncs);
  return CUDA_SUCCESS;
}

void destroy_streams_of(const Context& context) {
  std::vector<std::shared_ptr<Stream>> doomed;  // destroyed after the lock
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::erase_if(r.streams, [&](auto& entry) {
    if (&entry.second->context() != &context) return false;
    doomed.push_back(std::move(entry.second));
    return true;
  });
}

}  // namespace tide::standin
