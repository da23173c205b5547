#pragma once
// What the library trainer does besides the model and the data (train/trainer.hpp): the learning-
// rate schedule, the evaluation metric and `train_options`. The numeric options' ranges, flags
// and agreement are in their table (train/option_table.hpp).

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/train/namespace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <numbers>
#include <optional>
#include <ostream>
#include <string>

namespace hspmd::train {

/// The learning rate of each optimizer step: constant, or a linear warm-up from 0 to `peak`
/// over `warmup` steps followed by a cosine decay to `floor` at the last step.
struct lr_schedule {
  enum class kind : std::uint8_t { constant, cosine };
  kind shape = kind::constant;
  double peak = 1e-3;
  std::size_t warmup = 0;
  double floor = 0.0;

  [[nodiscard]] static lr_schedule constant(double lr) { return {kind::constant, lr, 0, 0.0}; }
  [[nodiscard]] static lr_schedule cosine(double peak, std::size_t warmup = 0, double floor = 0.0) {
    return {kind::cosine, peak, warmup, floor};
  }

  /// The rate of step `step` (0-based) of `steps`.
  [[nodiscard]] double at(std::size_t step, std::size_t steps) const {
    if (shape == kind::constant)
      return peak;
    if (step < warmup)
      return peak * static_cast<double>(step + 1) / static_cast<double>(warmup + 1);
    const std::size_t decay = steps > warmup + 1 ? steps - warmup - 1 : 1;
    const double t = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay));
    return floor + 0.5 * (peak - floor) * (1.0 + std::cos(std::numbers::pi * t));
  }
};

/// What an evaluation reports besides the loss.
enum class eval_metric : std::uint8_t {
  accuracy,  ///< arg-max of the loss's logits equals the target (classifiers, next token)
  perplexity ///< exp of the mean per-row loss (language models)
};

/// Everything the trainer does besides the model and the data. Every rank must pass the same.
struct train_options {
  std::string name = "model"; ///< printed in front of the progress and summary lines
  std::size_t batch = 8;      ///< samples per micro-batch (the traced batch)
  std::size_t accumulate = 1; ///< micro-batches per optimizer step (gradients averaged)
  std::size_t steps = 20;     ///< optimizer steps
  std::uint64_t seed = 1;     ///< parameters and dropout
  lr_schedule lr;             ///< learning rate per step (Adam's, unless another optimizer)
  double weight_decay = 0.0;  ///< AdamW's decoupled weight decay
  double clip = 1.0;          ///< clip gradients to this global norm (0: off)
  /// Where the tensors live: "host"; "cuda" (link hspmd::cuda; needs a GPU, and with a
  /// cluster one per rank, collectives over NCCL); "auto": a linked device engine that finds a
  /// device (on every rank), else the host.
  std::string device = "host";
  /// Mixed precision (kernels/precision.hpp): f32; bf16 (activations and GEMM operands in
  /// bfloat16, master weights and reductions in float); f16 (the same in binary16, with dynamic
  /// loss scaling: a step whose gradients overflow is skipped and the scale halved). Float
  /// models only.
  exec::precision precision = exec::precision::f32;
  /// Activation recomputation: each of the model's blocks (parameters named "layers.<k>.")
  /// keeps only what leaves it for the backward and runs its forward again there (one more
  /// forward of the blocks per step; exec::executor::recompute).
  bool recompute = false;

  std::string cluster; ///< cluster file: train on every rank of an MPI job; empty: one process
  std::optional<hspmd::cluster> cluster_spec; ///< a cluster already read (instead of the file)
  /// With a cluster: "synth" (default), "dp-ev", "dp-cp", "tp", or a plan JSON file (with
  /// `pipeline`: each stage's strategy, or a pipeline plan file).
  std::string plan;
  /// With a cluster: pipeline stages on groups of ranks (exec/pipeline.hpp), the devices of each
  /// group in rank order, e.g. "1,1" or "2,1,1"; a single number P: P groups of equal size.
  /// Empty: no pipeline. The step's micro-batches are `accumulate`'s.
  std::string pipeline;
  std::string pipeline_schedule = "1f1b"; ///< with pipeline: gpipe, 1f1b, interleaved, zb
  std::size_t pipeline_chunks = 1;        ///< with pipeline: stages per group (interleaved: 2+)
  /// With a cluster: price the plan by op and collective times measured at start-up. Unset: on
  /// where the cluster describes emulated devices (a "slowdown"), whose declared speeds and
  /// links describe some other machine, and no plan cache is asked for; off otherwise.
  std::optional<bool> calibrate;
  /// The model traced at another batch: calibration measures it at half the batch too, to learn
  /// which part of each op's time does not shrink with its rows (train/profile.hpp). The model
  /// function's constructor sets it; a graph given alone without it is priced in proportion.
  std::function<graph::graph(std::size_t batch)> trace_at;
  /// With a cluster: MiB of gradients all-reduced together, each bucket started as soon as the
  /// backward has produced it (0: the library default, synth::gradient_bucket_bytes).
  double bucket_mb = 0.0;
  /// With a cluster and plan "synth": pick the plan by the additive cost model alone (default:
  /// the synthesizer's final candidates are weighed by the simulated step too, sim::judge).
  bool rank_by_cost = false;
  bool explain = false;  ///< with a cluster: print the plan's explain table
  std::string trace;     ///< with a cluster: Chrome/Perfetto trace file of the run
  std::string save_plan; ///< with a cluster: write the plan as JSON here
  /// With a cluster and plan "synth": a directory of cached plans (synth/plan_cache.hpp).
  /// Rank 0 looks up, re-solves or synthesizes and stores, and gives every rank its plan.
  std::string plan_cache;
  std::string save_graph; ///< write the traced graph as JSON here (for `hspmd-plan --graph`)
  /// With a cluster: re-balance while training (train/rebalance.hpp) when a device computes,
  /// relative to the plan and over the median of `rebalance_window` steps, this many times
  /// slower than the others (e.g. 1.25): the ratios are re-solved at the measured speeds and
  /// the parameters and optimizer state move to the new pieces. 0: off.
  double rebalance = 0.0;
  std::size_t rebalance_window = 3;  ///< steps whose median re-balancing compares
  std::size_t rebalance_persist = 0; ///< windows in a row a device must lag; 0: window + 2
  double rebalance_min_gain = 0.05;  ///< the predicted step gain below which the plan stays
  /// Checkpoints (train/checkpoint.hpp, docs/checkpoint.md): the directory a run saves into and
  /// resumes from; every rank must see the same directory (one machine or a shared file system).
  std::string checkpoint_dir;
  std::size_t save_every = 0;       ///< save after every N steps and after the last (0: never)
  std::size_t keep_checkpoints = 0; ///< the newest checkpoints kept (0: all)
  /// Continue from the newest checkpoint in `checkpoint_dir` (any rank count, ratios or plan):
  /// its parameters, optimizer state and step; the feeds are asked for the micro-batches after
  /// it, so a feed that is a function of its index continues the run exactly. Without one, the
  /// run starts from step 0.
  bool resume = false;
  /// The RAM tier (train/ram_tier.hpp, docs/checkpoint.md): the state after every `ram_every`
  /// steps kept in memory files under this directory (a folder per node; "auto":
  /// /dev/shm/hspmd-ram-<uid>-<hash of checkpoint_dir>), each rank's also in a rank's of the next
  /// node (unless `no_ram_peers`). A resume takes the newest complete state of either tier.
  std::string ram_dir;
  std::size_t ram_every = 1;
  /// When > 0: the cadence measured on the run (train/ram_cadence.hpp) -- the fewest steps
  /// between saves that keep what they cost the steps within this share of a step.
  double ram_budget = 0.0;
  bool no_ram_peers = false;
  /// Start from the parameters of this checkpoint (a directory hspmd saved, under any layout, or
  /// one `hspmd-checkpoint import` wrote): the optimizer, schedule and data start at step 0. A
  /// run that resumes from `checkpoint_dir` ignores it.
  std::string init_from;

  std::size_t eval_every = 0;   ///< evaluate every N steps (0: only after the last step)
  std::size_t eval_batches = 1; ///< micro-batches per evaluation
  eval_metric metric = eval_metric::accuracy;

  std::string metrics; ///< JSON lines, one per step and evaluation, written by rank 0
  std::string
      report; ///< rank 0 draws the run's loss and step-time curves here (train/report_svg.hpp)
  std::ostream* out = &std::cout;   ///< progress and summary (rank 0); nullptr: quiet
  std::size_t log_every = 0;        ///< a progress line every N steps (0: about 20 in a run)
  std::string unit = "samples";     ///< throughput unit
  std::size_t units_per_sample = 1; ///< e.g. the sequence length, with unit "tokens"
  bool print_graph = false;         ///< print the traced graph (op, name, shape, FLOPs)
  bool profile = false;             ///< time each op kind and print where a step's time goes
};

} // namespace hspmd::train
