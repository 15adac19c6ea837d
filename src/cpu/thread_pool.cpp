// The CPU backend's thread pool (see thread_pool.hpp) and num_threads().
#include "cpu/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "metrale/cpu.hpp"

namespace metrale::cpu {
namespace detail {
namespace {

using Fn = std::function<void(int64_t, int64_t)>;

thread_local bool t_inside_task = false;  // set on workers and on a caller while it runs tasks

int32_t default_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int32_t(std::min(hw, 1024u));
}

class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  ~Pool() { stop_workers(); }

  int32_t size() {
    std::lock_guard<std::mutex> run_lock(run_mu_);
    return threads_;
  }

  void resize(int32_t n) {
    std::lock_guard<std::mutex> run_lock(run_mu_);
    if (n == threads_) return;
    stop_workers();
    threads_ = n;
    start_workers();
  }

  void run(int64_t n, int64_t grain, const Fn& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    if (t_inside_task || n <= grain) {
      fn(0, n);
      return;
    }
    std::unique_lock<std::mutex> run_lock(run_mu_);
    if (threads_ <= 1) {
      run_lock.unlock();
      fn(0, n);
      return;
    }
    // Dynamic chunks: ~16 per thread balances uneven items without much
    // contention on the counter.
    const int64_t chunk = std::max<int64_t>(grain, n / (int64_t(threads_) * 16));
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      chunk_ = chunk;
      next_.store(0, std::memory_order_relaxed);
      failed_.store(false, std::memory_order_relaxed);
      error_ = nullptr;
      busy_ = int32_t(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    t_inside_task = true;
    work();
    t_inside_task = false;
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
    fn_ = nullptr;
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  Pool() : threads_(default_threads()) { start_workers(); }

  void start_workers() {
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = false;
      gen = generation_;
    }
    // A worker starts from the generation current now, so a job published
    // before it first takes the lock is still seen as new.
    for (int32_t i = 1; i < threads_; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  void worker_loop(uint64_t seen) {
    t_inside_task = true;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_all();
    }
  }

  void work() {
    const Fn& fn = *fn_;
    while (!failed_.load(std::memory_order_relaxed)) {
      const int64_t b = next_.fetch_add(chunk_, std::memory_order_relaxed);
      if (b >= n_) break;
      const int64_t e = std::min(n_, b + chunk_);
      try {
        fn(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);
      }
    }
  }

  std::mutex run_mu_;  // one parallel_for (or resize) at a time
  int32_t threads_ = 1;
  std::vector<std::thread> workers_;

  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int32_t busy_ = 0;  // workers still inside the current generation
  const Fn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace

void parallel_for(int64_t n, int64_t grain, const Fn& fn) { Pool::instance().run(n, grain, fn); }

}  // namespace detail

int32_t num_threads() { return detail::Pool::instance().size(); }

// n <= 0 restores the default (the hardware concurrency); at most 1024.
void set_num_threads(int32_t n) {
  detail::Pool::instance().resize(n <= 0 ? detail::default_threads() : std::min(n, 1024));
}

}  // namespace metrale::cpu
