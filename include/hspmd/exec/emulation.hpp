#pragma once
// An emulated slower device: a rank whose cluster file says it is `s` times slower than the
// machine it runs on computes every kernel and then busy-waits (s - 1) times as long again,
// driving its collectives in flight meanwhile (MPI progresses only inside its calls). It also
// counts the rank's compute seconds, what re-balancing compares with the plan (train/
// rebalance.hpp).
//
// A kernel that communicates (the vocabulary-parallel cross-entropy's row reductions) is slowed
// phase by phase: its compute before each collective is stretched before the collective starts
// (`pause`), and the time spent waiting inside the collective is not stretched (`resume`) --
// once it was: rank 1's wait for the faster rank inside the cross-entropy counted twice, ~1 ms
// a BERT-small step.

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

namespace hspmd::exec {

/// The compute clock of one rank (see the file comment).
class emulated_device {
public:
  using clock = std::chrono::steady_clock;

  /// Every compute takes `s` times as long (at least 1).
  void set_slowdown(double s) noexcept { slowdown_ = std::max(1.0, s); }
  [[nodiscard]] double slowdown() const noexcept { return slowdown_; }
  /// Seconds computed (emulation included) since the last call.
  [[nodiscard]] double take_compute_seconds() noexcept {
    return std::exchange(compute_seconds_, 0.0);
  }

  /// Runs `f` as compute, stretched by the slowdown; `progress()` drives the collectives in
  /// flight while it waits.
  template <class F, class P>
  void compute(F&& f, P&& progress) {
    const auto start = clock::now();
    computing_ = start;
    f();
    wait_since(*computing_, progress);
    computing_.reset();
    compute_seconds_ += std::chrono::duration<double>(clock::now() - start).count();
  }
  /// Inside a compute, before a collective: the compute so far, stretched.
  template <class P>
  void pause(P&& progress) {
    if (computing_)
      wait_since(*computing_, progress);
  }
  /// Inside a compute, after a collective: the compute goes on from now.
  void resume() noexcept {
    if (computing_)
      computing_ = clock::now();
  }

private:
  // With a slowdown s: busy-waits (s - 1) times the time since `from`.
  template <class P>
  void wait_since(clock::time_point from, P& progress) {
    if (slowdown_ <= 1.0)
      return;
    const auto now = clock::now();
    const auto until =
        now + std::chrono::duration_cast<clock::duration>((now - from) * (slowdown_ - 1.0));
    while (clock::now() < until)
      progress();
  }

  double slowdown_ = 1.0;
  std::optional<clock::time_point> computing_; // a compute phase's start
  double compute_seconds_ = 0.0;
};

} // namespace hspmd::exec
