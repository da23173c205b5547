#pragma once
// Command-line flags for the library trainer's options, on a CLI11 app (CLI11 is the caller's
// dependency: include this header only in a program that links CLI11).
//
//     CLI::App app{"my trainer"};
//     exec::train_options o;                 // defaults the flags show in --help
//     exec::add_train_flags(app, o);
//     app.add_option("--hidden", hidden, "hidden width")->capture_default_str();
//     if (const auto rc = exec::parse_flags(app, argc, argv))
//       return *rc;                          // --help, or a bad flag (io/cli.hpp)

#include <hspmd/exec/trainer.hpp>
#include <hspmd/io/cli.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::exec {

using io::parse_flags;
using io::report_errors;

/// A count flag that must be 1 or more ("--batch 0" is refused with the fix).
inline const CLI::Validator at_least_one(
    [](std::string& value) -> std::string {
      if (value.find_first_not_of("0123456789") == std::string::npos && !value.empty() &&
          value.find_first_not_of('0') != std::string::npos)
        return {};
      return "value " + value + " is not allowed: give a whole number of 1 or more";
    },
    "COUNT >= 1");

/// Adds every trainer flag to `app`, writing into `o` (whose values are shown as defaults).
inline void add_train_flags(CLI::App& app, train_options& o) {
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--batch", o.batch, "samples per micro-batch")
      ->capture_default_str()
      ->check(at_least_one);
  app.add_option("--accumulate", o.accumulate,
                 "micro-batches per optimizer step (gradient accumulation)")
      ->capture_default_str()
      ->check(at_least_one);
  app.add_option("--seed", o.seed, "seed of parameters, dropout and synthetic data")
      ->capture_default_str();
  app.add_option("--lr", o.lr.peak, "(peak) learning rate of Adam")->capture_default_str();
  app.add_option_function<std::string>(
         "--schedule",
         [&o](const std::string& v) {
           o.lr.shape = v == "cosine" ? lr_schedule::kind::cosine : lr_schedule::kind::constant;
         },
         "learning-rate schedule: constant, or cosine (linear warm-up, then cosine decay to "
         "--min-lr)")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->default_str(o.lr.shape == lr_schedule::kind::constant ? "constant" : "cosine");
  app.add_option("--warmup", o.lr.warmup, "cosine schedule: warm-up steps")->capture_default_str();
  app.add_option("--min-lr", o.lr.floor, "cosine schedule: learning rate at the last step")
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW's decoupled weight decay")
      ->capture_default_str();
  app.add_option("--clip", o.clip, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "host, cuda (a GPU per process; the program links hspmd::cuda) or auto (GPUs "
                 "when every process has one, else the host)")
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--precision",
         [&o](const std::string& v) {
           const auto p = parse_precision(v);
           if (!p)
             throw CLI::ValidationError("--precision",
                                        v + " is not f32, bf16 or f16 (give one of them)");
           o.precision = *p;
         },
         "f32 (default); bf16: activations and GEMM operands in bfloat16, master weights in "
         "float; f16: the same in binary16 with dynamic loss scaling")
      ->default_str("f32");
  app.add_option("--cluster", o.cluster,
                 "train on every rank of an MPI job (mpirun -np N, one rank per device of this "
                 "cluster file); one process when absent");
  app.add_flag("--recompute", o.recompute,
               "recompute each block's activations in the backward instead of keeping them "
               "(one more forward of the blocks per step, a block's activations in memory)");
  app.add_option("--plan", o.plan,
                 "with --cluster: synth (default), dp-ev, dp-cp, tp, or a plan JSON file");
  app.add_flag_callback(
      "--calibrate", [&o] { o.calibrate = true; },
      "with --cluster: before planning, time the model's ops on rank 0 and the collectives on "
      "all ranks, and price the plan by those measurements (default: on where the cluster has "
      "emulated devices, whose declared numbers describe another machine)");
  app.add_flag_callback(
      "--no-calibrate", [&o] { o.calibrate = false; },
      "with --cluster: price the plan by the cluster file's numbers even where it has emulated "
      "devices");
  app.add_option("--bucket-mb", o.bucket_mb,
                 "with --cluster: MiB of gradients per all-reduce bucket, each started during the "
                 "backward as soon as it is complete (0: the library default)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--rank-by-cost", o.rank_by_cost,
               "with --cluster: pick the synthesized plan by the cost model alone (default: its "
               "final candidates are weighed by the simulated step too)");
  app.add_flag("--explain", o.explain, "with --cluster: print the plan's explain table");
  app.add_option("--trace", o.trace,
                 "with --cluster: write a Chrome/Perfetto trace (a track per rank: compute, "
                 "collectives, idle, steps) to this file, and the simulated step "
                 "(sim/step.hpp) beside it (t.json: t.simulated.json)");
  app.add_option("--save-plan", o.save_plan, "with --cluster: write the plan as JSON to this file");
  app.add_option("--plan-cache", o.plan_cache,
                 "with --cluster: keep synthesized plans in this directory; a start with the same "
                 "model, options and cluster reads its plan, and one whose cluster numbers "
                 "changed re-solves its ratios only");
  app.add_option("--rebalance", o.rebalance,
                 "with --cluster: re-balance while training when a device is persistently this "
                 "many times slower than the others relative to the plan (e.g. 1.25): ratios "
                 "re-solved at the measured speeds, parameters and optimizer state moved; 0: off")
      ->capture_default_str();
  app.add_option("--rebalance-window", o.rebalance_window,
                 "with --rebalance: steps whose median is compared")
      ->capture_default_str()
      ->check(at_least_one);
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "the directory checkpoints are saved into (--save-every) and resumed from "
                 "(--resume); shared by every rank");
  app.add_option("--save-every", o.save_every,
                 "save a checkpoint after every N steps and after the last (0: never)")
      ->capture_default_str();
  app.add_option("--keep-checkpoints", o.keep_checkpoints,
                 "keep only the newest N checkpoints (0: all)")
      ->capture_default_str();
  app.add_flag("--resume", o.resume,
               "continue from the newest checkpoint in --checkpoint-dir (saved under any rank "
               "count or plan); from step 0 when it has none");
  app.add_option("--init-from", o.init_from,
                 "start from the parameters of this checkpoint (any layout, or what "
                 "hspmd-checkpoint import wrote); optimizer and data start fresh");
  app.add_option("--save-graph", o.save_graph,
                 "write the traced graph as JSON to this file (hspmd-plan --graph plans it)");
  app.add_option("--eval-every", o.eval_every,
                 "evaluate every N steps (0: only after the last step)")
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "micro-batches per evaluation")
      ->capture_default_str()
      ->check(at_least_one);
  app.add_option("--metrics", o.metrics,
                 "write one JSON line per step and evaluation (loss, lr, grad norm, seconds) "
                 "to this file");
  app.add_option("--log-every", o.log_every, "a progress line every N steps (0: about 20 lines)")
      ->capture_default_str();
  app.add_flag("--print-graph", o.print_graph, "print the traced graph (op, name, shape, FLOPs)");
  app.add_flag("--profile", o.profile, "time each op kind and print where a step's time goes");
  app.add_flag_callback(
      "--quiet", [&o] { o.out = nullptr; }, "no progress or summary lines");
}

} // namespace hspmd::exec
