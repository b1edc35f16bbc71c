// parallel_for over XLA's intra-op thread pool, shared by the CPU kernels in this folder.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace mathrl {

// What the caller and the pool's tasks share; owned jointly so a task that starts after the call returned (every
// item already taken) touches nothing freed.
struct ParallelWork {
  int n = 0;
  std::function<void(int)> fn;
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  void run() {
    for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      fn(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Runs fn(0) .. fn(n - 1), spread over the caller and the pool. The caller waits only for items a task has taken,
// never for a task to start (the pool may have no thread to spare, e.g. when this call runs on its only one).
inline void parallel_for(xla::ffi::ThreadPool& pool, int n, std::function<void(int)> fn) {
  auto work = std::make_shared<ParallelWork>();
  work->n = n;
  work->fn = std::move(fn);
  const int helpers = static_cast<int>(std::min<int64_t>(pool.num_threads(), n) - 1);
  for (int t = 0; t < helpers; ++t) pool.Schedule([work] { work->run(); });
  work->run();
  while (work->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

}  // namespace mathrl
