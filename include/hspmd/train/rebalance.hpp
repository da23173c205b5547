#pragma once
// When to re-balance a running job: every step each rank measures its compute seconds (exec/
// distributed.hpp `take_compute_seconds`), the ranks share them, and a `straggler_monitor` fed
// the same numbers on every rank decides, the same on every rank, whether one device is
// persistently off its modelled speed and by how much. The trainer then re-solves the ratios
// at the measured speeds (`measured_cluster`) and moves the run's state to the new pieces.
//
// The rule (thresholds are options, `rebalance_options`):
// - A rank's *lag* is its measured compute over the plan's predicted compute for it
//   (synth::plan::device_compute), over the median of the last `window` steps; its *factor* is
//   its lag over the smallest lag. Constant errors of the model (the whole machine faster or
//   slower than the cluster file says) cancel in the factor; a device that slowed down (or
//   sped up, relative to the others) does not.
// - The first step of a run and the first after a re-balance are not counted (allocation,
//   caches); a re-balance needs a full window measured under the current plan.
// - When the largest factor reaches `threshold`, the monitor reports every rank's factor: the
//   trainer divides each device's speed by it. A recovered device shows up the same way (the
//   others then lag it), and the ratios go back.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/train/namespace.hpp>

namespace hspmd::train {

/// Re-balancing thresholds (see the file comment).
struct rebalance_options {
  double threshold = 1.25; ///< re-balance when a device is this much slower than the others
  std::size_t window = 3;  ///< steps whose median is compared (after one warm-up step)
};

/// Decides, from the same numbers on every rank, when and how much to re-balance.
class straggler_monitor {
public:
  /// `predicted`: the plan's compute seconds per device for one step.
  straggler_monitor(rebalance_options o, std::vector<double> predicted)
      : o_(o), predicted_(std::move(predicted)) {}

  /// One step's measured compute seconds per rank. Returns every rank's factor when the largest
  /// reaches the threshold over a full window, else nothing.
  [[nodiscard]] std::optional<std::vector<double>> observe(std::span<const double> measured) {
    if (skip_ > 0) {
      --skip_;
      return std::nullopt;
    }
    history_.emplace_back(measured.begin(), measured.end());
    if (history_.size() > o_.window)
      history_.erase(history_.begin());
    if (history_.size() < o_.window)
      return std::nullopt;
    auto f = factors();
    if (f.empty() || *std::ranges::max_element(f) < o_.threshold)
      return std::nullopt;
    return f;
  }

  /// The current factors (empty until a full window was measured): median lag per rank over
  /// the smallest.
  [[nodiscard]] std::vector<double> factors() const {
    if (history_.size() < o_.window || history_.empty())
      return {};
    const std::size_t n = predicted_.size();
    std::vector<double> lag(n, 0.0);
    for (std::size_t r = 0; r < n; ++r) {
      std::vector<double> xs;
      for (const auto& h : history_)
        if (r < h.size())
          xs.push_back(h[r]);
      if (xs.empty() || !(predicted_[r] > 0.0))
        continue; // no prediction to compare with: counted as on time
      std::ranges::nth_element(xs, xs.begin() + static_cast<std::ptrdiff_t>(xs.size() / 2));
      lag[r] = xs[xs.size() / 2] / predicted_[r];
    }
    double least = 0.0;
    for (double l : lag)
      if (l > 0.0 && (least == 0.0 || l < least))
        least = l;
    std::vector<double> f(n, 1.0);
    if (least > 0.0)
      for (std::size_t r = 0; r < n; ++r)
        if (lag[r] > 0.0)
          f[r] = lag[r] / least;
    return f;
  }

  /// After a re-balance (or a decision not to): the new plan's predictions; the window starts
  /// again after one uncounted step.
  void restart(std::vector<double> predicted) {
    predicted_ = std::move(predicted);
    history_.clear();
    skip_ = 1;
  }

private:
  rebalance_options o_;
  std::vector<double> predicted_;
  std::vector<std::vector<double>> history_;
  std::size_t skip_ = 1; // the run's first step
};

/// `c` with each device's compute rates divided by its factor (a device measured `f` times
/// slower than modelled computes at speed / f).
[[nodiscard]] inline cluster measured_cluster(cluster c, std::span<const double> factors) {
  for (std::size_t d = 0; d < c.devices.size() && d < factors.size(); ++d)
    if (factors[d] > 0.0)
      c.devices[d].slow_by(factors[d]);
  return c;
}

} // namespace hspmd::train
