#pragma once
// The trainer's three uses of checkpoints, as plain functions over one rank's engine and world:
// saving the training state after a step (train/checkpoint.hpp through the engine, with the run's
// metadata from train/run_meta.hpp), resuming from the newest checkpoint of --checkpoint-dir
// (naming what the search passed over), and taking a checkpoint's parameters only
// (--init-from). Collective: every rank calls them together.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/fault.hpp>
#include <hspmd/train/loss_scale.hpp>
#include <hspmd/train/metrics_log.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/ram_cadence.hpp>
#include <hspmd/train/ram_state.hpp>
#include <hspmd/train/ram_tier.hpp>
#include <hspmd/train/report.hpp>
#include <hspmd/train/results.hpp>
#include <hspmd/train/run_meta.hpp>
#include <hspmd/train/train_options.hpp>
#include <hspmd/train/world.hpp>

#include <algorithm>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
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
  std::uint64_t graph_hash; ///< synth::graph_hash(g)
  const synth::plan* plan;  ///< a distributed run's, else nullptr
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
  const auto meta =
      checkpoint_meta(s.graph_hash, s.o, s.plan, optimizer_meta(s.opt, s.o), step, loss_scale);
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

/// The RAM tier's directory (--ram-dir; "auto": /dev/shm/hspmd-ram-<uid>-<hash of the absolute
/// --checkpoint-dir>, so runs of other checkpoint directories never meet).
[[nodiscard]] inline std::filesystem::path ram_directory(const train_options& o) {
  if (o.ram_dir != "auto")
    return o.ram_dir;
  const std::string abs =
      std::filesystem::weakly_canonical(std::filesystem::absolute(o.checkpoint_dir)).string();
  return "/dev/shm/hspmd-ram-" + std::to_string(::getuid()) + "-" +
         to_hex(fnv1a64(abs)).substr(0, 12);
}

/// Keeps the state after `step` in the RAM tier `ro` (train/ram_tier.hpp); returns the seconds
/// training waited for it (the run's metadata, the state's list, the tier's own wait).
template <std::floating_point T, class Optimizer>
double save_run_ram(const run_context<T, Optimizer>& s, std::size_t step,
                    const dynamic_loss_scale* loss_scale, const ram_options& ro) {
  const auto t0 = std::chrono::steady_clock::now();
  s.w.set_phase("keeping the state after step " + std::to_string(step) + " in the RAM tier");
  const auto meta =
      checkpoint_meta(s.graph_hash, s.o, s.plan, optimizer_meta(s.opt, s.o), step, loss_scale);
  s.e.ram_save(step, meta, s.opt, ro);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// A name for this launch's RAM tier job, drawn by rank 0 (the clock and its process id).
[[nodiscard]] inline std::string ram_job_name(world& w) {
  std::string job;
  if (w.root()) {
    const auto now = std::chrono::system_clock::now().time_since_epoch().count();
    job = to_hex(fnv1a64(std::to_string(now) + "/" + std::to_string(::getpid()))).substr(0, 10);
  }
  w.broadcast_text(job);
  return job;
}

/// The RAM tier's settings for this launch: the directory, a job name rank 0 draws, every
/// rank's node (`c`'s devices in rank order; one node without a cluster). Collective.
[[nodiscard]] inline ram_options ram_setup(const train_options& o, world& w, const cluster* c,
                                           const std::string& resumed_job) {
  ram_options ro;
  ro.dir = ram_directory(o);
  ro.peers = !o.no_ram_peers;
  ro.job = ram_job_name(w);
  if (!resumed_job.empty())
    ro.retire.push_back(resumed_job);
  for (std::size_t r = 0; r < static_cast<std::size_t>(w.size()); ++r)
    ro.nodes.push_back("node-" + std::to_string(c != nullptr ? c->devices.at(r).node : 0));
  if (w.root()) { // a node fault's marks (below) from an earlier launch
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ro.dir, ec))
      if (e.path().filename().string().starts_with(".lost-r"))
        std::filesystem::remove(e.path(), ec);
  }
  return ro;
}

/// Whether the fault `f` of kind node strikes this rank: any rank on rank f.rank's node. Its
/// node's RAM tier folder goes first; the node's ranks then wait for each other (marks in the
/// tier's directory, at most 2 s) and the first ends them all, as a machine's loss does.
[[nodiscard]] inline bool node_fault_strikes(const fault_spec& f, world& w, const cluster* c,
                                             const std::optional<ram_options>& ram) {
  if (c == nullptr)
    return f.rank == w.rank();
  const auto& d = c->devices;
  const auto me = static_cast<std::size_t>(w.rank());
  if (d.at(me).node != d.at(static_cast<std::size_t>(f.rank)).node)
    return false;
  if (!ram)
    return true;
  std::error_code ec;
  std::filesystem::remove_all(ram->dir / ram->nodes.at(me), ec);
  const auto mark = [&](std::size_t r) { return ram->dir / (".lost-r" + std::to_string(r)); };
  std::ofstream(mark(me).string() + ".tmp") << ::getpid() << "\n";
  std::filesystem::rename(mark(me).string() + ".tmp", mark(me), ec);
  std::vector<long> pids;
  bool first = true;
  for (int tries = 0; tries < 2000; ++tries) {
    pids.clear();
    first = true;
    for (std::size_t r = 0; r < d.size(); ++r)
      if (d[r].node == d[me].node && r != me) {
        long pid = 0;
        std::ifstream(mark(r)) >> pid;
        pids.push_back(pid);
        first = first && r > me;
      }
    if (std::ranges::all_of(pids, [](long p) { return p > 0; }))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The node's first rank ends the others and then itself (inject_fault): they end within
  // microseconds, not at the scheduler's whim; the others wait for it (2 s at most).
  if (first) {
    for (const long p : pids)
      if (p > 0)
        (void)::kill(static_cast<pid_t>(p), SIGKILL);
  } else
    std::this_thread::sleep_for(std::chrono::seconds(2));
  return true;
}

/// --ram-budget: the cadence from rank 0's measurements (train/ram_cadence.hpp), every rank
/// the same; a line and a metrics record. Collective.
inline void decide_ram_cadence(ram_cadence& c, world& w, std::ostream* out, metrics_log& metrics,
                               double budget) {
  std::string every = w.root() ? std::to_string(c.proposal()) : std::string();
  w.broadcast_text(every);
  c.decide(static_cast<std::size_t>(std::stoull(every)));
  const double step = c.step_seconds();
  const double share = step > 0.0 ? c.save_cost() / step : 0.0;
  if (out != nullptr)
    print(*out,
          "RAM tier: a save costs %.1f ms of a %.1f ms step (%.1f %%, measured): keeping the "
          "state every %zu step(s) keeps it within %.3g %%\n",
          1e3 * c.save_cost(), 1e3 * step, 100.0 * share, c.every(), 100.0 * budget);
  metrics.write({{"event", "ram_cadence"},
                 {"every", c.every()},
                 {"save_ms", 1e3 * c.save_cost()},
                 {"step_ms", 1e3 * step},
                 {"budget", budget}});
}

/// The RAM tier's line after a run (rank 0's figures) and its metrics record.
inline void say_ram(std::ostream* out, metrics_log& metrics, const train_result& r) {
  const ram_stats& st = r.ram;
  // What training waited: the saves (metadata, the state's list, the tier's own wait) and,
  // before updates, copies not yet done.
  const double total = r.ram_save_seconds + st.copy_seconds;
  const double n = static_cast<double>(std::max<std::size_t>(st.saves, 1));
  if (out != nullptr)
    print(*out,
          "RAM tier: %zu saves, training waited %.1f ms a save (%.1f saving, %.1f for copies "
          "before updates), %.1f MiB a rank%s\n",
          st.saves, 1e3 * total / n, 1e3 * r.ram_save_seconds / n, 1e3 * st.copy_seconds / n,
          static_cast<double>(st.bytes) / 1048576.0,
          st.peers > 0 ? ", copies on the next node" : ", no peer copies");
  metrics.write({{"event", "ram_tier"},
                 {"saves", st.saves},
                 {"waited_ms", 1e3 * total},
                 {"save_ms", 1e3 * r.ram_save_seconds},
                 {"copy_ms", 1e3 * st.copy_seconds},
                 {"transfer_waited_ms", 1e3 * st.transfer_seconds},
                 {"max_tier_waited_ms", 1e3 * st.max_blocked_seconds},
                 {"bytes", st.bytes},
                 {"peer_bytes", st.peer_bytes}});
}

namespace detail {
// Rank 0: the RAM tier's newest complete state when it is newer than the disk's newest (then
// made a checkpoint directory: "DIR\nJOB"), else ""; what it passed over goes to `notes`.
[[nodiscard]] inline std::string newer_ram_state(const train_options& o,
                                                 const checkpoint_search& disk,
                                                 std::vector<std::string>& notes) {
  const std::filesystem::path dir = ram_directory(o);
  const auto st = find_ram_state(dir, &notes);
  const std::optional<std::size_t> disk_step =
      disk.found ? step_of(*disk.found) : std::optional<std::size_t>();
  if (!st) {
    notes.push_back("RAM tier " + dir.string() + ": no complete state");
    return "";
  }
  if (disk_step && *disk_step >= st->step) {
    notes.push_back("RAM tier " + dir.string() + ": step " + std::to_string(st->step) +
                    " is not newer than the disk's step " + std::to_string(*disk_step));
    return "";
  }
  std::string line = "RAM tier " + dir.string() + ": step " + std::to_string(st->step) +
                     " of job " + st->job + ", newer than the disk's " +
                     (disk_step ? "step " + std::to_string(*disk_step) : std::string("none"));
  for (const std::string& p : st->from_peers)
    line += "; " + p;
  notes.push_back(line);
  return assemble_ram_checkpoint(dir, *st).string() + "\n" + st->job;
}
} // namespace detail

/// Loads the newest state of --checkpoint-dir and, with --ram-dir, of the RAM tier, if any,
/// naming what it passed over; returns the step to continue from, nothing when there is none.
template <std::floating_point T, class Optimizer>
std::optional<std::size_t> resume_run(const run_context<T, Optimizer>& s, train_result& r,
                                      dynamic_loss_scale* loss_scale) {
  s.w.set_phase("resuming from " + s.o.checkpoint_dir);
  // Rank 0's view decides (the load agrees on the directory again).
  const checkpoint_search found = search_checkpoints(s.o.checkpoint_dir);
  std::vector<std::string> notes; // the RAM tier's
  std::string ram;                // "DIR\nJOB": a RAM tier's state, newer than the disk's
  if (!s.o.ram_dir.empty() && s.w.root())
    ram = detail::newer_ram_state(s.o, found, notes);
  s.w.broadcast_text(ram);
  std::string any = found.found.has_value() || !ram.empty() ? "1" : "";
  s.w.broadcast_text(any);
  const auto say_notes = [&](const std::vector<std::string>& skipped) {
    for (const std::string& line : skipped)
      if (s.out != nullptr)
        print(*s.out, "resume: %s\n", line.c_str());
  };
  say_notes(notes);
  if (any.empty()) {
    say_notes(found.skipped);
    if (s.out != nullptr)
      print(*s.out, "resume: no checkpoint in %s yet; starting from step 0\n",
            s.o.checkpoint_dir.c_str());
    return std::nullopt;
  }
  std::filesystem::path from = s.o.checkpoint_dir;
  if (!ram.empty()) {
    from = ram.substr(0, ram.find('\n'));
    r.ram_resumed = ram.substr(ram.find('\n') + 1);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const checkpoint_info info = s.e.load_state(from, s.opt, false);
  if (ram.empty())
    say_notes(info.notes);
  else if (s.w.root()) { // every rank has read it (the load ends agreeing)
    std::error_code ec;
    std::filesystem::remove_all(from.parent_path(), ec);
  }
  const auto steps = check_resumed(info, s.g, Optimizer::kind, loss_scale, &s.o);
  if constexpr (requires { s.opt.set_steps(std::size_t{}); })
    if (steps)
      s.opt.set_steps(*steps);
  r.resumed_from = info.step;
  r.load_seconds = detail::slowest_since(s.e, t0);
  if (s.out != nullptr)
    print(*s.out, "resumed from %s: step %zu of %zu (loaded in %.0f ms)\n",
          ram.empty() ? info.dir.string().c_str() : "the RAM tier", info.step, s.o.steps,
          1e3 * r.load_seconds);
  return std::min(info.step, s.o.steps);
}

} // namespace hspmd::train
