// A small persistent thread pool behind the CPU backend's parallel loops.
//
// One process-wide pool of std::threads (num_threads() - 1 workers; the
// calling thread is the last worker). parallel_for hands out chunks of the
// index range dynamically, so uneven items (sequences of different lengths)
// balance. A parallel_for issued from inside a pool task runs serially on
// that task's thread; concurrent calls from different user threads are
// serialised. The first exception a task throws is rethrown to the caller
// after every chunk in flight has finished.
#pragma once

#include <cstdint>
#include <functional>

namespace metrale::cpu::detail {

// Calls fn(begin, end) on disjoint sub-ranges covering [0, n). Each call gets
// at least `grain` indices (except the last).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace metrale::cpu::detail
