// Events that tell the allocator when a freed block's pending work is done.
//
// Two kinds:
//  - fences: a block freed on stream S is reusable on S at once (stream order), and on another
//    stream only after an event recorded on S after the free has completed. Recording one event
//    per free would put a driver call on every cached free, so the fence is recorded when the
//    allocator first wants S's free blocks for another stream (its slow path): an event recorded
//    later on S completes no earlier than one recorded at the free, so reuse is never earlier
//    than the rule allows. A fence recorded when the allocator's free counter was q covers every
//    block freed on S with a free sequence number <= q.
//  - record_stream events: a block used on other streams (record_stream) gets an event on each of
//    them when it is freed, as in PyTorch, and is not reused before they all complete.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

namespace tide::allocator::device {

struct Block;

// CUevents, reused (cuEventCreate is not free). The device's context must be current when it
// creates or destroys events.
class EventPool {
 public:
  EventPool() = default;
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  CUevent acquire();
  void release(CUevent event);
  // Destroys the spare events now (the context must be current).
  void clear();

 private:
  std::vector<CUevent> spare_;
};

class StreamFences {
 public:
  explicit StreamFences(EventPool& events) : events_(events) {}

  struct Completed {
    CUstream stream;
    std::uint64_t covers;  // blocks freed on `stream` with free sequence number <= this
  };

  // Records a fence on `stream` covering free sequence numbers <= `covers`, unless one is in
  // flight there already. Returns false if the stream cannot take an event any more (destroyed):
  // the caller then synchronises the context instead.
  bool record(CUstream stream, std::uint64_t covers);
  bool in_flight(CUstream stream) const;
  // Fences that have completed (cuEventQuery), retired.
  std::vector<Completed> poll();
  // Waits for every fence in flight and retires them all.
  std::vector<Completed> wait_all();

 private:
  struct Fence {
    CUstream stream;
    std::uint64_t covers;
    CUevent event;
  };
  EventPool& events_;
  std::vector<Fence> fences_;
};

// Blocks freed while other streams may still use them (record_stream).
class PendingFrees {
 public:
  explicit PendingFrees(EventPool& events) : events_(events) {}

  // Records an event on each of `block`'s other streams and keeps the block until they complete.
  // A stream that cannot take an event any more is skipped (its work was submitted before the
  // free; the caller synchronises the context before reusing such blocks).
  void add(Block* block);
  // Blocks whose events have all completed (cuEventQuery).
  std::vector<Block*> poll();
  // Waits for all events; returns every block.
  std::vector<Block*> wait_all();
  std::size_t count() const { return pending_.size(); }
  std::size_t bytes() const;

 private:
  struct Pending {
    Block* block;
    std::vector<CUevent> events;
  };
  EventPool& events_;
  std::vector<Pending> pending_;
};

}  // namespace tide::allocator::device
