#pragma once
// A batch made ahead on a background thread: while step i computes, batch i + 1 is read (a
// memory-mapped corpus's pages fault in there, not in the step). Batches are functions of their
// index, so what the thread makes is what the step would have made itself; an index out of
// turn (an evaluation, a resume) is made on the spot. An error making a batch is thrown by the
// `get` that asks for it.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace hspmd::data {

template <class Batch>
class prefetcher {
public:
  using make_fn = std::function<void(std::uint64_t index, Batch& into)>;

  explicit prefetcher(make_fn make) : make_(std::move(make)), thread_([this] { loop(); }) {}
  prefetcher(const prefetcher&) = delete;
  prefetcher& operator=(const prefetcher&) = delete;
  ~prefetcher() {
    {
      std::lock_guard<std::mutex> l(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// Batch `index`, valid until the next call; then starts making `index + 1`.
  const Batch& get(std::uint64_t index) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !want_; }); // the thread is done with what it was asked for
    if (made_ == index) {
      std::swap(front_, back_);
      made_.reset();
      if (error_) {
        const std::exception_ptr e = std::exchange(error_, nullptr);
        std::rethrow_exception(e);
      }
    } else {
      error_ = nullptr;
      l.unlock();
      make_(index, front_);
      l.lock();
    }
    want_ = index + 1;
    made_.reset();
    l.unlock();
    cv_.notify_all();
    return front_;
  }

private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return quit_ || want_.has_value(); });
      if (quit_)
        return;
      const std::uint64_t index = *want_;
      l.unlock();
      std::exception_ptr e;
      try {
        make_(index, back_);
      } catch (...) {
        e = std::current_exception();
      }
      l.lock();
      error_ = e;
      made_ = index;
      want_.reset();
      cv_.notify_all();
    }
  }

  make_fn make_;
  std::mutex mu_;
  std::condition_variable cv_;
  Batch front_{}, back_{};
  std::optional<std::uint64_t> want_; // asked of the thread, not yet made
  std::optional<std::uint64_t> made_; // in back_
  std::exception_ptr error_;          // making made_ failed
  bool quit_ = false;
  std::thread thread_;
};

} // namespace hspmd::data
