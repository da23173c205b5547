#pragma once
// How often the RAM tier keeps the state (--ram-budget): the cadence that keeps what saving
// costs the steps within a share of a step, measured on the run itself (as CheckFreq does).
//
// A save's cost is mostly not what training waits for (train/ram_tier.hpp copies and sends in
// the background) but what the background work takes from the step that follows it, which
// depends on the machine: on a host whose cores all train, the copy, the peer transfer and the
// checksums slow the next step by their whole length; with cores to spare, hardly at all. So it
// is measured as that: a step with the save after it and the work of the save before it,
// against a step without either. After `warmup` steps without saves come `window` steps without
// (the baseline), then saves after each of `window` steps and the steps after them; the cost is
// the difference of the two medians, and the cadence is the fewest steps between saves that
// keep cost / cadence within budget x the baseline step. Before the decision only the measured
// saves are made (the first warmup + window steps of a run are not kept in the RAM tier);
// afterwards every `every()`-th step.
//
// The measurements are one rank's; a distributed run decides on rank 0's and broadcasts the
// cadence (steps are in lockstep: every rank's step takes the slowest one's time).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <vector>

namespace hspmd::train {

class ram_cadence {
public:
  /// `budget`: the share of a step saves may cost (0.05: 5 %); `fixed`: --ram-every, the
  /// cadence when budget is 0 or the run is too short to measure (`steps` in all).
  ram_cadence(double budget, std::size_t fixed, std::size_t steps, std::size_t first = 0,
              std::size_t window = 5, std::size_t warmup = 2)
      : budget_(budget), every_(fixed), first_(first), window_(window), warmup_(warmup) {
    if (budget_ <= 0.0 || steps < first + warmup + 3 * window + 1)
      decided_ = true; // (short runs keep the fixed cadence)
  }

  /// Whether the state after step `done` (1-based, of the run) is kept.
  [[nodiscard]] bool save_after(std::size_t done) const {
    if (decided_)
      return done % every_ == 0;
    const std::size_t k = done - first_; // steps this run
    return k > warmup_ + window_ && k <= warmup_ + 2 * window_;
  }

  /// The wall time of step `done`, from its start to the next one's (a save after it counts in
  /// it and its background work in the next). True when the cadence is now to be decided
  /// (`decide`, collectively).
  bool measure(std::size_t done, double seconds) {
    const std::size_t k = done - first_;
    // Step warmup+1 .. warmup+window: no save before them (the baseline); the steps after
    // each of the window's saves: warmup+window+2 .. warmup+2*window+1.
    if (k > warmup_ && k <= warmup_ + window_)
      without_.push_back(seconds);
    else if (k > warmup_ + window_ + 1 && k <= warmup_ + 2 * window_ + 1)
      with_.push_back(seconds);
    return !decided_ && k == warmup_ + 2 * window_ + 1;
  }

  /// The cadence from the measurements (rank 0's; the others pass what it broadcast).
  [[nodiscard]] std::size_t proposal() const {
    const double cost = std::max(0.0, median(with_) - median(without_));
    const double allowed = budget_ * median(without_);
    if (allowed <= 0.0)
      return 1;
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(cost / allowed - 1e-9)), 1,
                                   1000);
  }
  void decide(std::size_t every) {
    every_ = std::max<std::size_t>(every, 1);
    decided_ = true;
  }

  [[nodiscard]] bool decided() const noexcept { return decided_; }
  [[nodiscard]] std::size_t every() const noexcept { return every_; }
  /// The baseline step and a save's cost (seconds), medians.
  [[nodiscard]] double step_seconds() const { return median(without_); }
  [[nodiscard]] double save_cost() const { return std::max(0.0, median(with_) - median(without_)); }

private:
  [[nodiscard]] static double median(std::vector<double> v) {
    if (v.empty())
      return 0.0;
    std::ranges::sort(v);
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }

  double budget_;
  std::size_t every_;
  std::size_t first_, window_, warmup_;
  bool decided_ = false;
  std::vector<double> without_, with_;
};

} // namespace hspmd::train
