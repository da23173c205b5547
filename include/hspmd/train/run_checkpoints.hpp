#pragma once
// The trainer's three uses of checkpoints, as plain functions over one rank's engine and world:
// saving the training state after a step (train/checkpoint.hpp through the engine, with the run's
// metadata from train/run_meta.hpp), resuming from the newest checkpoint of --checkpoint-dir
// (naming what the search passed over), and taking a checkpoint's parameters only
// (--init-from). Collective: every rank calls them together.

#include <hspmd/graph/ir.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/fault.hpp>
#include <hspmd/train/loss_scale.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/report.hpp>
#include <hspmd/train/results.hpp>
#include <hspmd/train/run_meta.hpp>
#include <hspmd/train/train_options.hpp>
#include <hspmd/train/world.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::train {

/// What the checkpoint steps of one run work on; `out` is rank 0's stream (nullptr elsewhere).
template <std::floating_point T, class Optimizer>
struct run_context {
  engine<T, Optimizer>& e;
  world& w;
  const train_options& o;
  Optimizer& opt;
  const graph::graph& g;
  const synth::plan* plan; ///< a distributed run's, else nullptr
  std::ostream* out;
};

namespace detail {
template <class E>
[[nodiscard]] double slowest_since(E& e, std::chrono::steady_clock::time_point t0) {
  return e.slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}
} // namespace detail

/// Saves the state after `step` steps into --checkpoint-dir; `fault`: HSPMD_FAULT, for a fault
/// injected at a point of this save.
template <std::floating_point T, class Optimizer>
void save_run_checkpoint(const run_context<T, Optimizer>& s, std::size_t step, train_result& r,
                         const dynamic_loss_scale* loss_scale,
                         const std::optional<fault_spec>& fault) {
  s.w.set_phase("saving the checkpoint after step " + std::to_string(step));
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint_options co;
  co.keep = s.o.keep_checkpoints;
  if (fault && !fault->save_point.empty() && fault->step == step && fault->rank == s.w.rank())
    co.at_point = [f = *fault](std::string_view point) {
      if (point == f.save_point)
        inject_fault(f);
    };
  const auto meta = checkpoint_meta(s.g, s.o, s.plan, optimizer_meta(s.opt, s.o), step, loss_scale);
  const auto dir = s.e.save_state(s.o.checkpoint_dir, step, meta, s.opt, co);
  const double seconds = detail::slowest_since(s.e, t0);
  r.checkpoints.push_back(dir.string());
  if (s.out != nullptr)
    print(*s.out, "checkpoint after step %zu: %s (%.0f ms)\n", step, dir.string().c_str(),
          1e3 * seconds);
}

/// The parameters of the checkpoint --init-from names (any layout, or an import): the optimizer,
/// the schedule and the data start fresh.
template <std::floating_point T, class Optimizer>
void initialize_run(const run_context<T, Optimizer>& s, train_result& r) {
  s.w.set_phase("initializing from " + s.o.init_from);
  const auto t0 = std::chrono::steady_clock::now();
  const checkpoint_info info = s.e.load_state(s.o.init_from, s.opt, true);
  r.initialized_from = info.dir.string();
  const double seconds = detail::slowest_since(s.e, t0);
  if (s.out != nullptr)
    print(*s.out, "parameters from %s (step %zu%s; loaded in %.0f ms)\n", info.dir.string().c_str(),
          info.step, info.meta.contains("imported") ? ", imported" : "", 1e3 * seconds);
}

/// Loads the newest checkpoint of --checkpoint-dir, if any, naming the newer folders it passed
/// over; returns the step to continue from, nothing when there is none.
template <std::floating_point T, class Optimizer>
std::optional<std::size_t> resume_run(const run_context<T, Optimizer>& s, train_result& r,
                                      dynamic_loss_scale* loss_scale) {
  s.w.set_phase("resuming from " + s.o.checkpoint_dir);
  // Rank 0's view decides (the load agrees on the directory again).
  const checkpoint_search found = search_checkpoints(s.o.checkpoint_dir);
  std::string any = found.found.has_value() ? "1" : "";
  s.w.broadcast_text(any);
  const auto say_notes = [&](const std::vector<std::string>& skipped) {
    for (const std::string& line : skipped)
      if (s.out != nullptr)
        print(*s.out, "resume: %s\n", line.c_str());
  };
  if (any.empty()) {
    say_notes(found.skipped);
    if (s.out != nullptr)
      print(*s.out, "resume: no checkpoint in %s yet; starting from step 0\n",
            s.o.checkpoint_dir.c_str());
    return std::nullopt;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const checkpoint_info info = s.e.load_state(s.o.checkpoint_dir, s.opt, false);
  say_notes(info.notes);
  const auto steps = check_resumed(info, s.g, Optimizer::kind, loss_scale, &s.o);
  if constexpr (requires { s.opt.set_steps(std::size_t{}); })
    if (steps)
      s.opt.set_steps(*steps);
  r.resumed_from = info.step;
  r.load_seconds = detail::slowest_since(s.e, t0);
  if (s.out != nullptr)
    print(*s.out, "resumed from %s: step %zu of %zu (loaded in %.0f ms)\n",
          info.dir.string().c_str(), info.step, s.o.steps, 1e3 * r.load_seconds);
  return std::min(info.step, s.o.steps);
}

} // namespace hspmd::train
