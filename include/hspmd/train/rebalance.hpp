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
//   its lag over the others' (the median lag from 3 ranks on, else the smaller lag). Constant
//   errors of the model (the whole machine faster or slower than the cluster file says) cancel
//   in the factor; a device that slowed down (or sped up, relative to the others) does not.
// - The first step of a run and the first after a re-balance are not counted (allocation,
//   caches); a re-balance needs a full window measured under the current plan.
// - Hysteresis, so that a noisy machine does not move shares back and forth: a device must be
//   the one furthest off (factor f, or 1/f for a device faster than the others) by `threshold`
//   or more in `persist` windows in a row (window + 2 by default), and so over the median of all
//   their steps (the factors reported); within `4 x window` steps of a move, a move the other
//   way (the device that lost share now fast, or the one that gained it now slow) needs
//   threshold squared; the trainer keeps the plan when the re-solved ratios gain less than
//   `min_gain` of the predicted step, and then the monitor takes the factors it measured as its
//   new baseline (only a further change triggers).
// - Then the monitor reports every rank's factor: the trainer divides each device's speed by it.
//   A recovered device shows up the same way (it now runs ahead), and the ratios go back.

#include <algorithm>
#include <cmath>
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
  std::size_t persist = 0; ///< windows in a row a device must be off by threshold; 0: window + 2
  double min_gain = 0.05;  ///< keep the plan when re-solving gains less of the predicted step
};

/// Decides, from the same numbers on every rank, when and how much to re-balance.
class straggler_monitor {
public:
  /// `predicted`: the plan's compute seconds per device for one step.
  straggler_monitor(rebalance_options o, std::vector<double> predicted)
      : o_(o), predicted_(std::move(predicted)) {
    if (o_.persist == 0)
      o_.persist = o_.window + 2;
  }

  /// One step's measured compute seconds per rank. Returns every rank's factor when one device
  /// has been off by the threshold long enough (see the file comment), else nothing.
  [[nodiscard]] std::optional<std::vector<double>> observe(std::span<const double> measured) {
    if (skip_ > 0) {
      --skip_;
      return std::nullopt;
    }
    ++since_move_;
    history_.emplace_back(measured.begin(), measured.end());
    if (history_.size() > o_.window + o_.persist - 1)
      history_.erase(history_.begin());
    if (history_.size() < o_.window)
      return std::nullopt;
    auto f = factors(o_.window);
    if (f.empty())
      return std::nullopt;
    const std::size_t worst = furthest(f);
    const double need = reversal(f, worst) ? o_.threshold * o_.threshold : o_.threshold;
    if (off_by(f[worst]) < need) {
      streak_ = 0;
      return std::nullopt;
    }
    if (streak_ == 0 || worst != streak_device_)
      streak_ = 0;
    streak_device_ = worst;
    if (++streak_ < o_.persist)
      return std::nullopt;
    // Off in every window of the streak: the factors over all its steps decide (and are what
    // the trainer re-solves with), a median of more steps than one window's.
    f = factors(history_.size());
    if (furthest(f) != worst || off_by(f[worst]) < need)
      return std::nullopt;
    return f;
  }

  /// The current factors (empty until a full window was measured): median lag per rank (over
  /// the baseline's) over the others' (the median lag from 3 ranks on, else the smallest).
  [[nodiscard]] std::vector<double> factors() const { return factors(o_.window); }

  /// The factors over the last `steps` measured steps (at most those kept).
  [[nodiscard]] std::vector<double> factors(std::size_t steps) const {
    if (history_.size() < o_.window || history_.empty())
      return {};
    const std::size_t n = predicted_.size();
    const std::size_t first = history_.size() - std::min(steps, history_.size());
    std::vector<double> lag(n, 0.0);
    for (std::size_t r = 0; r < n; ++r) {
      std::vector<double> xs;
      for (std::size_t k = first; k < history_.size(); ++k)
        if (r < history_[k].size())
          xs.push_back(history_[k][r]);
      if (xs.empty() || !(predicted_[r] > 0.0))
        continue; // no prediction to compare with: counted as on time
      lag[r] = median(xs) / predicted_[r] / (r < baseline_.size() ? baseline_[r] : 1.0);
    }
    std::vector<double> positive;
    for (double l : lag)
      if (l > 0.0)
        positive.push_back(l);
    double reference = 0.0;
    if (positive.size() >= 3) {
      std::ranges::nth_element(positive,
                               positive.begin() + static_cast<std::ptrdiff_t>(positive.size() / 2));
      reference = positive[positive.size() / 2];
    } else if (!positive.empty())
      reference = *std::ranges::min_element(positive);
    std::vector<double> f(n, 1.0);
    if (reference > 0.0)
      for (std::size_t r = 0; r < n; ++r)
        if (lag[r] > 0.0)
          f[r] = lag[r] / reference;
    return f;
  }

  /// After a re-balance (or a decision not to): the new plan's predictions; the window starts
  /// again after one uncounted step.
  void restart(std::vector<double> predicted) {
    predicted_ = std::move(predicted);
    history_.clear();
    skip_ = 1;
    streak_ = 0;
  }

  /// The trainer moved shares by `factors`: moves back are held to threshold squared for a while,
  /// and the baseline is reset (the new plan's predictions are at the measured speeds).
  void moved(std::vector<double> factors) {
    last_move_ = std::move(factors);
    since_move_ = 0;
    baseline_.clear();
  }

  /// The trainer kept the plan at `factors`: they become the baseline, so only a further change
  /// triggers (the device stays modelled at its old speed).
  void keep(std::span<const double> factors) {
    baseline_.resize(factors.size(), 1.0);
    for (std::size_t r = 0; r < factors.size(); ++r)
      if (factors[r] > 0.0)
        baseline_[r] *= factors[r];
  }

private:
  [[nodiscard]] static double off_by(double f) { return f >= 1.0 ? f : 1.0 / f; }

  // The median (the mean of the middle two of an even count).
  [[nodiscard]] static double median(std::vector<double> xs) {
    std::ranges::sort(xs);
    const std::size_t h = xs.size() / 2;
    return xs.size() % 2 == 1 ? xs[h] : 0.5 * (xs[h - 1] + xs[h]);
  }

  [[nodiscard]] static std::size_t furthest(std::span<const double> f) {
    std::size_t w = 0;
    for (std::size_t r = 1; r < f.size(); ++r)
      if (off_by(f[r]) > off_by(f[w]))
        w = r;
    return w;
  }

  // Whether reporting `f` (furthest off: device `worst`) soon after a move would undo it.
  [[nodiscard]] bool reversal(std::span<const double> f, std::size_t worst) const {
    if (last_move_.size() != f.size() || since_move_ > 4 * o_.window)
      return false;
    const auto lo =
        static_cast<std::size_t>(std::ranges::min_element(last_move_) - last_move_.begin());
    const auto hi =
        static_cast<std::size_t>(std::ranges::max_element(last_move_) - last_move_.begin());
    // The device that gained share now slow, or the one that lost it now ahead.
    const bool slow_now = f[worst] >= 1.0;
    return (slow_now && worst == lo) || (!slow_now && worst == hi);
  }

  rebalance_options o_;
  std::vector<double> predicted_;
  std::vector<std::vector<double>> history_;
  std::vector<double> baseline_;  // per device: factors the trainer kept the plan at
  std::vector<double> last_move_; // the factors of the last move
  std::size_t since_move_ = 0;    // steps observed since it
  std::size_t streak_ = 0, streak_device_ = 0;
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
