#pragma once
// What starting a run makes besides its options: a started distributed rank
// (`distributed_run`, train/start.hpp starts one), and the recomputation switch both a single
// process and a rank turn on the same way.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/report.hpp>
#include <hspmd/train/run_plan.hpp>
#include <hspmd/train/train_options.hpp>
#include <hspmd/train/world.hpp>

#include <concepts>
#include <memory>
#include <optional>

namespace hspmd::train {

/// This rank of a started distributed run: the ranks, the plan and what prices it, this rank's
/// engine, the MFU facts, and re-balancing's state when the run re-balances.
template <std::floating_point T, class Optimizer>
struct distributed_run {
  std::unique_ptr<world> ranks;
  planned_run run;
  std::unique_ptr<rank_engine<T, Optimizer>> engine;
  /// A pipeline run's engine (instead of engine).
  std::unique_ptr<train::engine<T, Optimizer>> pipeline;
  flops_meter meter;
  std::optional<rebalancing> rebalance;
};

/// Activation recomputation on `e` when `o` asks for it; `say`: print what it keeps.
template <std::floating_point T, class Optimizer>
void enable_recompute(engine<T, Optimizer>& e, const graph::graph& g, const train_options& o,
                      bool say) {
  if (!o.recompute)
    return;
  if (scope_segments(g).empty()) // the whole graph: the same answer on every rank
    throw config_error("--recompute", "the model has no blocks to recompute",
                       "name block parameters \"layers.<k>.\" (the zoo's models do), or drop "
                       "--recompute");
  const std::size_t bytes = e.recompute();
  if (say && o.out != nullptr)
    print(*o.out,
          "recompute: each block's activations made again in the backward; %.2f MiB "
          "hold one block's at a time\n",
          static_cast<double>(bytes) / (1024.0 * 1024.0));
}

} // namespace hspmd::train
