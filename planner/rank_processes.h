// A node's local ranks as forked processes, for measurements that need them all running at once
// (`tide calibrate --ranks`, bench/node_update): each rank a process of its own, as torchrun
// starts them, so that each has its own CPU pool, driver context and pinned memory.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tide::planner {

// What a rank's body may call: returns when every rank still running has called it too (a rank
// that exited no longer holds the others back).
using RankBarrier = std::function<void()>;

// Runs body(rank, barrier) in `ranks` forked processes at once and returns what each returned
// (at most 4 KiB each), by rank. With `local_env`, a rank has LOCAL_RANK and LOCAL_WORLD_SIZE set
// before its body runs (its CPU pool is then its share of the node's cores); without, both are
// unset (a rank that assumes it is alone). Call it before this process starts threads or a driver
// context: a child gets a copy of the calling thread only. Throws std::runtime_error naming the
// first rank whose body threw (with its message) or that died.
std::vector<std::string> run_ranks(
    int ranks, bool local_env,
    const std::function<std::string(int rank, const RankBarrier& barrier)>& body);

}  // namespace tide::planner
