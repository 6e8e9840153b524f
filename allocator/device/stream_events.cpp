#include "allocator/device/stream_events.h"

#include <utility>

#include "allocator/device/block.h"
#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::allocator::device {
namespace {

bool event_done(CUevent event) {
  const CUresult r = driver::cuda().cuEventQuery(event);
  if (r == CUDA_ERROR_NOT_READY) return false;
  driver::check(r, "cuEventQuery");
  return true;
}

}  // namespace

EventPool::~EventPool() { clear(); }

void EventPool::clear() {
  for (CUevent e : spare_) driver::cuda().cuEventDestroy(e);
  spare_.clear();
}

CUevent EventPool::acquire() {
  if (!spare_.empty()) {
    CUevent e = spare_.back();
    spare_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  TIDE_CU(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
  return e;
}

void EventPool::release(CUevent event) { spare_.push_back(event); }

bool StreamFences::record(CUstream stream, std::uint64_t covers) {
  if (in_flight(stream)) return true;
  CUevent event = events_.acquire();
  const CUresult r = driver::cuda().cuEventRecord(event, stream);
  if (r != CUDA_SUCCESS) {
    events_.release(event);
    if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE) return false;
    driver::check(r, "cuEventRecord");
  }
  fences_.push_back(Fence{stream, covers, event});
  return true;
}

bool StreamFences::in_flight(CUstream stream) const {
  for (const Fence& f : fences_) {
    if (f.stream == stream) return true;
  }
  return false;
}

std::vector<StreamFences::Completed> StreamFences::poll() {
  std::vector<Completed> done;
  for (std::size_t i = 0; i < fences_.size();) {
    if (event_done(fences_[i].event)) {
      done.push_back({fences_[i].stream, fences_[i].covers});
      events_.release(fences_[i].event);
      fences_[i] = fences_.back();
      fences_.pop_back();
    } else {
      ++i;
    }
  }
  return done;
}

std::vector<StreamFences::Completed> StreamFences::wait_all() {
  std::vector<Completed> done;
  for (const Fence& f : fences_) {
    TIDE_CU(cuEventSynchronize, f.event);
    done.push_back({f.stream, f.covers});
    events_.release(f.event);
  }
  fences_.clear();
  return done;
}

void PendingFrees::add(Block* block) {
  Pending p{block, {}};
  for (CUstream s : block->uses) {
    CUevent event = events_.acquire();
    const CUresult r = driver::cuda().cuEventRecord(event, s);
    if (r != CUDA_SUCCESS) {
      events_.release(event);
      if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE) continue;
      for (CUevent e : p.events) events_.release(e);
      driver::check(r, "cuEventRecord");
    }
    p.events.push_back(event);
  }
  block->state = BlockState::kPending;
  pending_.push_back(std::move(p));
}

std::vector<Block*> PendingFrees::poll() {
  std::vector<Block*> done;
  for (std::size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    while (!p.events.empty() && event_done(p.events.back())) {
      events_.release(p.events.back());
      p.events.pop_back();
    }
    if (p.events.empty()) {
      done.push_back(p.block);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    } else {
      ++i;
    }
  }
  return done;
}

std::vector<Block*> PendingFrees::wait_all() {
  std::vector<Block*> done;
  for (Pending& p : pending_) {
    for (CUevent e : p.events) {
      TIDE_CU(cuEventSynchronize, e);
      events_.release(e);
    }
    done.push_back(p.block);
  }
  pending_.clear();
  return done;
}

std::size_t PendingFrees::bytes() const {
  std::size_t total = 0;
  for (const Pending& p : pending_) total += p.block->size;
  return total;
}

}  // namespace tide::allocator::device
