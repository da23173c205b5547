#pragma once
// What training reports: each step, each evaluation, each re-balance, and a whole `fit`. Plain
// structs, the same on every rank (train/trainer.hpp returns them; train/report.hpp prints them).

#include <hspmd/train/namespace.hpp>
#include <hspmd/train/ram_tier.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace hspmd::train {

/// One finished optimizer step, the same on every rank.
struct step_report {
  std::size_t step = 0; ///< 0-based
  double loss = 0.0;    ///< mean over the step's micro-batches
  double lr = 0.0;
  double grad_norm = 0.0; ///< before clipping
  double seconds = 0.0;   ///< the slowest rank's time for the step
};

/// One evaluation (forward only, dropout off).
struct eval_report {
  std::size_t after_step = 0; ///< steps trained before it
  double loss = 0.0;          ///< mean over the evaluated micro-batches
  double accuracy = std::numeric_limits<double>::quiet_NaN();
  double perplexity = std::numeric_limits<double>::quiet_NaN();
};

/// One re-balance while training (`train_options::rebalance`), the same on every rank.
struct rebalance_report {
  std::size_t after_step = 0;  ///< steps trained before it
  std::vector<double> factors; ///< per device: measured lag over the least (the trigger)
  std::vector<double> shares_before, shares_after; ///< per device, the first segment's ratios
  double solve_seconds = 0.0;    ///< the ratio LP's re-solve (rank 0), warm where it could
  std::size_t lp_iterations = 0; ///< its simplex iterations
  bool warm = false;             ///< started from the previous basis
  double move_seconds = 0.0;     ///< re-lowering and moving parameters and optimizer state
  double predicted_before = 0.0; ///< the old plan's step time at the measured speeds
  double predicted_after = 0.0;  ///< the new plan's
  bool moved = false;            ///< false: the shares came out the same, nothing moved
};

/// What `trainer::fit` measured.
struct train_result {
  std::vector<double> losses;       ///< per step
  std::vector<double> step_seconds; ///< per step, slowest rank
  std::vector<eval_report> evals;
  double predicted_step_seconds = 0.0;      ///< the plan's prediction (distributed runs)
  double simulated_step_seconds = 0.0;      ///< the simulator's (sim/step.hpp), same pricing
  std::size_t skipped_steps = 0;            ///< f16: steps whose gradients overflowed (not applied)
  double loss_scale = 1.0;                  ///< f16: the dynamic loss scale after the last step
  std::vector<rebalance_report> rebalances; ///< with `train_options::rebalance`
  std::size_t resumed_from = 0;             ///< the step a resumed run continued after (0: none)
  double load_seconds = 0.0;                ///< the resumed checkpoint's load (slowest rank)
  ram_stats ram;                            ///< what the RAM tier cost this rank (--ram-dir)
  double ram_save_seconds = 0.0;            ///< rank 0's time in the RAM tier's saves, all told
  std::string ram_resumed;       ///< the RAM tier's state the run resumed from ("" : none)
  std::size_t stopped_after = 0; ///< hspmd-run asked the job to stop after this step (0: no)
  std::string initialized_from;  ///< the checkpoint whose parameters the run started from, if any
  std::vector<std::string> checkpoints; ///< the checkpoint directories this run committed

  /// Median step time without the first (warm-up) step.
  [[nodiscard]] double median_step_seconds() const {
    auto v = step_seconds;
    if (v.size() > 2)
      v.erase(v.begin());
    if (v.empty())
      return 0.0;
    std::ranges::sort(v);
    return v[v.size() / 2];
  }
};

} // namespace hspmd::train
