// Allocated blocks by address: an open-addressing hash map (linear probing, backward-shift
// deletion) that allocates only when it grows, so that a warm allocate/free pair costs no malloc.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tide::allocator::device {

struct Block;

class PtrMap {
 public:
  PtrMap() { slots_.resize(kInitialCapacity); }

  Block* find(CUdeviceptr key) const {
    for (std::size_t i = index(key);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == 0) return nullptr;
    }
  }

  // `key` must not be present and must not be 0.
  void insert(CUdeviceptr key, Block* value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(key, value);
    ++size_;
  }

  // Removes `key` and returns its value (null if absent).
  Block* erase(CUdeviceptr key) {
    std::size_t i = index(key);
    for (;; i = (i + 1) & mask()) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return nullptr;
    }
    Block* value = slots_[i].value;
    // Backward shift: move later members of the probe run into the hole while that keeps each
    // of them at or after its home slot.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      const std::size_t home = index(slots_[j].key);
      const bool movable = ((j - home) & mask()) >= ((j - hole) & mask());
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return value;
  }

  std::size_t size() const { return size_; }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_) {
      if (s.key != 0) fn(s.key, s.value);
    }
  }

 private:
  static constexpr std::size_t kInitialCapacity = 1024;
  struct Slot {
    CUdeviceptr key = 0;
    Block* value = nullptr;
  };

  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t index(CUdeviceptr key) const {
    // Blocks start at multiples of 512 bytes: drop those bits, then mix (Fibonacci hashing).
    const std::uint64_t h = (static_cast<std::uint64_t>(key) >> 9) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> 32) & mask();
  }
  void place(CUdeviceptr key, Block* value) {
    std::size_t i = index(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = Slot{key, value};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.key != 0) place(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace tide::allocator::device
