// The recorded timeline of stream work (tide_standin_record, tide_standin_recorded: standin.h):
// every copy and kernel launch submitted while recording is on, with its stream, its addresses,
// and when it was submitted, started and ended, so that a test can prove overlap by the order of
// events instead of by durations. Off by default; at most the capacity given when it starts
// (TIDE_STANDIN_RECORD_MAX at most), allocated then; later work is counted as dropped.
#pragma once

#include <cstddef>
#include <cstdint>

#include "standin/standin.h"

namespace tide::standin {

// One submitted operation's entry: the work stamps its start and end as it runs. Does nothing
// when the operation was not recorded (recording off or full), or when recording restarted since.
class RecordedOp {
 public:
  void started() const;
  void ended() const;

 private:
  friend RecordedOp record_submission(const tide_standin_op& op);
  std::uint64_t generation_ = 0;  // 0: not recorded
  std::size_t index_ = 0;
};

// At submission: records `op` (its times are set here: submitted now, not yet started).
RecordedOp record_submission(const tide_standin_op& op);

// 0 stops recording and frees it; otherwise starts afresh with room for `capacity` operations.
// CUDA_ERROR_INVALID_VALUE above TIDE_STANDIN_RECORD_MAX, CUDA_ERROR_OUT_OF_MEMORY.
int start_recording(std::size_t capacity);
// Copies the first min(max, recorded) operations to `out`; sets the number recorded and dropped.
void copy_recording(tide_standin_op* out, std::size_t max, std::size_t* recorded,
                    std::uint64_t* dropped);

}  // namespace tide::standin
