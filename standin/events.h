// Events: a recorded event is a position in a stream's timeline, plus the host time at which
// the work before it was done (for cuEventElapsedTime).
#pragma once

#include <cuda.h>

#include <chrono>
#include <memory>

#include "standin/streams.h"
#include "standin/timeline.h"

namespace tide::standin {

class Context;

struct EventRecord {
  Position position;
  // Written by the stream's worker before the position is reached; read only after.
  std::chrono::steady_clock::time_point time;
};

CUresult event_create(CUevent* out, unsigned flags);
CUresult event_destroy(CUevent event);
CUresult event_record(CUevent event, CUstream stream, DefaultStream fallback);
CUresult event_query(CUevent event);
CUresult event_synchronize(CUevent event);
CUresult event_elapsed_time(float* ms, CUevent start, CUevent end);

// The event's most recent record, null if it was never recorded.
CUresult last_record(CUevent event, std::shared_ptr<EventRecord>* out);

// Destroys the events created in `context`, when it is destroyed.
void destroy_events_of(const Context& context);

}  // namespace tide::standin
