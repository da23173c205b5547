#pragma once
// The checks a run makes of its options before any work, beyond each option's own range (the
// option table's `check_train_options`): options against each other, against the trainer's types
// and HSPMD_FAULT, the checkpoint directory (made and written in on every rank), and the traced
// model's sizes. Each refuses in one line naming the option and the fix.

#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/train/fault.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/train_options.hpp>
#include <hspmd/train/world.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace hspmd::train {

/// What the run's check needs to know of the trainer's types: whether the model is traced in
/// float, and whether the optimizer shows its state (checkpoints and re-balancing move it).
struct trainer_types {
  bool float_model = true;
  bool optimizer_state = true;
  std::string optimizer; ///< its name, for the message
};

/// Refuses, before any training, a checkpoint directory that cannot be made or written in
/// (otherwise found at the first save, that many steps of work later). Rank 0 makes it, then
/// every rank writes and removes a probe file of its own there (every rank writes its own
/// pieces into it at a save). Collective.
inline void check_checkpoint_dir(const train_options& o, world& w) {
  if (o.checkpoint_dir.empty() || o.save_every == 0)
    return;
  const std::filesystem::path dir(o.checkpoint_dir);
  const auto refuse = [&](const std::string& why) {
    throw config_error("checkpoint directory " + o.checkpoint_dir, why,
                       "give --checkpoint-dir a directory every rank can create and write in");
  };
  std::string made; // rank 0's failure to make it, told to every rank
  if (w.root()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      made = "cannot be created (" + ec.message() + ")";
  }
  w.broadcast_text(made);
  if (!made.empty())
    refuse(made);
  const std::filesystem::path probe = dir / (".hspmd-probe-rank-" + std::to_string(w.rank()));
  bool ok = false;
  {
    std::ofstream f(probe, std::ios::binary | std::ios::trunc);
    f << "hspmd";
    f.flush();
    ok = f.good();
  }
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  const std::vector<double> all = w.all_gather(ok ? 1.0 : 0.0);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] == 0.0)
      refuse("cannot be written in on rank " + std::to_string(r));
}

/// Every option of a run checked before any work, one line naming the option and the fix: the
/// table's ranges (`check_train_options`), then what relates options to each other, to the
/// trainer's types and to HSPMD_FAULT's `fault` (train/fault.hpp).
inline void check_run_options(const train_options& o, bool distributed,
                              const std::optional<fault_spec>& fault, const trainer_types& types) {
  if (!distributed) { // (a distributed run checks it with its ranks, train/distributed_start.hpp)
    world alone;
    check_checkpoint_dir(o, alone);
  }
  if (fault && !fault->save_point.empty() &&
      (fault->what == fault_spec::kind::slow || o.save_every == 0 ||
       (fault->step % o.save_every != 0 && fault->step != o.steps) || fault->step > o.steps))
    throw config_error("HSPMD_FAULT " + fault->kind_text() + " at " + fault->where(),
                       "strikes during a save this run does not make (or is slow, which "
                       "applies from a step on)",
                       "give at:saveN:POINT with N a step --save-every saves at");
  if (fault && fault->what == fault_spec::kind::slow && !distributed)
    throw config_error("HSPMD_FAULT " + fault->kind_text(),
                       "slows a rank of a distributed run; one process has no peers to wait",
                       "give a cluster, or another kind");
  if (!o.plan_cache.empty() && !o.plan.empty() && o.plan != "synth")
    throw config_error("plan cache " + o.plan_cache,
                       "keeps synthesized plans, and plan " + o.plan + " is not synthesized",
                       "drop the plan cache, or give plan synth");
  // Every number within its range; in one process, nothing that needs a cluster.
  check_train_options(o, distributed);
  if (o.lr.floor > o.lr.peak)
    throw config_error("learning rate " + std::to_string(o.lr.peak),
                       "needs 0 < lr and 0 <= floor <= lr", "give a positive learning rate");
  if (o.precision != exec::precision::f32 && !types.float_model)
    throw config_error("precision " + std::string(name(o.precision)),
                       "needs a model of float (16-bit activations, float master weights)",
                       "give precision f32, or trace the model in float");
  if (o.rebalance != 0.0) {
    if (!(o.rebalance > 1.0))
      throw config_error("rebalance " + std::to_string(o.rebalance),
                         "is how many times slower than the others a device must be before "
                         "the run re-balances, so it must exceed 1",
                         "give e.g. 1.25, or 0 to turn re-balancing off");
    if (o.plan == "dp-ev")
      throw config_error("rebalance with plan dp-ev",
                         "dp-ev shares the batch evenly by definition, and re-balancing "
                         "changes the shares",
                         "give plan dp-cp or synth (or drop --rebalance)");
    if (!types.optimizer_state)
      throw config_error("rebalance with optimizer " + types.optimizer,
                         "keeps its state private, so re-balancing cannot move it",
                         "train with exec::adam or exec::sgd, or drop --rebalance");
  }
  if (o.pipeline.empty() && (o.pipeline_schedule != "1f1b" || o.pipeline_chunks != 1))
    throw config_error(o.pipeline_chunks != 1
                           ? "--pipeline-chunks " + std::to_string(o.pipeline_chunks)
                           : "--pipeline-schedule " + o.pipeline_schedule,
                       "shapes a pipeline, and no --pipeline is given",
                       "give --pipeline (the groups), or drop it");
  if (!o.pipeline.empty()) { // what a pipeline run does not do yet (train/pipeline_engine.hpp)
    const auto refuse = [](const std::string& what, const char* why) {
      throw config_error(what + " with --pipeline", why, "drop it, or train without --pipeline");
    };
    if (o.rebalance != 0.0)
      refuse("--rebalance", "re-balancing moves a one-level plan's shares, not a pipeline's");
    if (!o.ram_dir.empty())
      refuse("--ram-dir", "the RAM tier keeps one-level and two-level runs' state only");
    if (o.recompute && o.pipeline_schedule == "zb")
      refuse("--recompute and --pipeline-schedule zb",
             "a block replayed for its input gradients would be needed again for its weights'");
    if (o.precision != exec::precision::f32)
      refuse("--precision " + std::string(name(o.precision)), "pipeline stages run in f32");
    if (o.device != "host" && o.device != "auto")
      refuse("--device " + o.device, "pipeline stages run on the host for now");
    if (!o.plan_cache.empty())
      refuse("--plan-cache", "caches one-level plans");
    if (o.profile)
      refuse("--profile", "per-op profiles of pipeline stages are not collected yet");
    if (o.calibrate.value_or(false))
      refuse("--calibrate", "stage plans are priced by the cluster file's numbers");
  }
  if ((o.save_every > 0 || o.resume) && o.checkpoint_dir.empty())
    throw config_error(o.resume ? "resume" : "save every " + std::to_string(o.save_every),
                       "needs the directory checkpoints live in",
                       "give a checkpoint directory (--checkpoint-dir DIR)");
  if (!o.ram_dir.empty() && o.checkpoint_dir.empty())
    throw config_error("RAM tier " + o.ram_dir, "keeps recent steps; the disk tier stays",
                       "give a checkpoint directory too (--checkpoint-dir DIR, --save-every N)");
  if (o.ram_budget > 0.0 && o.ram_dir.empty())
    throw config_error("--ram-budget", "sets how often the RAM tier keeps the state",
                       "give the RAM tier's directory (--ram-dir DIR or auto), or drop it");
  if (!types.optimizer_state && (o.save_every > 0 || o.resume || !o.ram_dir.empty()))
    throw config_error("checkpoints with optimizer " + types.optimizer,
                       "keeps its state private, so a checkpoint cannot hold it",
                       "train with exec::adam or exec::sgd");
}

/// A model size of 0 (--seq 0, a width of 0) traces tensors of no elements, whose loss is a mean
/// over nothing: refused naming the model, the node and its shape, not trained to a loss of 0.
inline void check_model_sizes(const graph::graph& g, const std::string& model) {
  for (const graph::node& n : g.nodes())
    if (n.out.size() == 0) {
      std::string shape;
      for (std::size_t d : n.out.dims)
        shape += (shape.empty() ? "(" : ", ") + std::to_string(d);
      throw config_error("model " + model + ": " + n.name + " " + shape + ")",
                         "has no elements, so the step would train on nothing",
                         "give every size of the model (sequence length, widths, heads, "
                         "vocabulary) 1 or more");
    }
}

} // namespace hspmd::train
