#pragma once
// Independent work items on a few threads: the planner's candidates and a candidate's stages.
// Each item's result must not depend on which thread runs it or when; an item that throws
// does not stop the others, and the exception of the lowest such item is rethrown once every
// thread is done -- what a loop over the items in order would have thrown first.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace hspmd {

/// Runs `work(i)` for i in [0, n) on up to `threads` threads (0: as many as the hardware runs;
/// 1: in order on the calling thread).
template <class Work>
void parallel_for(std::size_t n, std::size_t threads, const Work& work) {
  if (n == 0)
    return;
  if (threads == 0)
    threads = std::max<unsigned>(std::thread::hardware_concurrency(), 1U);
  threads = std::clamp<std::size_t>(threads, 1, n);
  std::atomic<std::size_t> next{0};
  std::vector<std::exception_ptr> failed(n);
  const auto run = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        work(i);
      } catch (...) {
        failed[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t)
    pool.emplace_back(run);
  run();
  for (std::thread& t : pool)
    t.join();
  for (const std::exception_ptr& e : failed)
    if (e)
      std::rethrow_exception(e);
}

} // namespace hspmd
