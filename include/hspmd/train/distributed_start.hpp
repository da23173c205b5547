#pragma once
// How a distributed run starts on the ranks of an MPI job (train/start.hpp includes it where
// hspmd::mpi is linked): the ranks as a `world`, the options agreed, the cluster loaded, the
// device engine chosen by all, calibration when the cluster's numbers describe another machine,
// the plan chosen (train/run_plan.hpp), this rank's engine built, and the MFU facts shared.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/comm/calibrate.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>
#include <hspmd/comm/watchdog.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/agreement.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/train/distributed_engine.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/option_checks.hpp>
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/pipeline_start.hpp>
#include <hspmd/train/profile.hpp>
#include <hspmd/train/report.hpp>
#include <hspmd/train/run_plan.hpp>
#include <hspmd/train/started.hpp>
#include <hspmd/train/world.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace hspmd::train {

/// The ranks of the MPI job (MPI_COMM_WORLD) as a training run's world.
class mpi_world final : public world {
public:
  mpi_world() {
    // Training bounds every wait (comm/watchdog.hpp): HSPMD_TIMEOUT, else 300 s.
    comm_.set_timeout(timeout_from_env(default_training_timeout));
  }
  [[nodiscard]] mpi_communicator& comm() noexcept { return comm_; }
  [[nodiscard]] int rank() const override { return comm_.rank(); }
  [[nodiscard]] int size() const override { return comm_.size(); }
  void set_phase(std::string phase) override { comm_.set_phase(std::move(phase)); }
  void guarded(const std::function<void()>& body) override {
    run_guarded([&] {
      body();
      return 0;
    });
  }
  void broadcast_text(std::string& text) override {
    auto size = static_cast<std::uint64_t>(text.size());
    comm_.broadcast(std::span<std::uint64_t>(&size, 1), 0);
    text.resize(static_cast<std::size_t>(size));
    comm_.broadcast(std::span<char>(text), 0);
  }
  void broadcast(std::vector<double>& values) override {
    comm_.broadcast(std::span<double>(values), 0);
  }
  [[nodiscard]] std::vector<double> all_gather(double mine) override {
    std::vector<double> all(static_cast<std::size_t>(comm_.size()));
    comm_.all_gather_v(std::span<const double>(&mine, 1), std::span<double>(all),
                       std::vector<std::size_t>(all.size(), 1), uneven_algorithm::native);
    return all;
  }

private:
  mpi_communicator comm_;
};

/// The device engine of every rank (nullptr: the host), agreed by all: "host"; a registered
/// engine that trains distributed and finds a device on every rank; "auto": such an engine if
/// every rank has a device for it, else the host. Collective.
template <std::floating_point T, class Optimizer>
[[nodiscard]] const device_engine_entry<T, Optimizer>* distributed_device(const std::string& d,
                                                                          mpi_communicator& comm) {
  if (d == "host")
    return nullptr;
  const auto usable_everywhere = [&](const device_engine_entry<T, Optimizer>& e, std::string& why) {
    const int mine = e.probe(why) > 0 ? comm.size() : comm.rank();
    return comm.all_reduce(mine, reduce_op::min); // the first rank without one, or size
  };
  if (d == "auto") {
    for (const auto& e : device_engines<T, Optimizer>()) {
      std::string why;
      if (e.make_distributed && usable_everywhere(e, why) == comm.size())
        return &e;
    }
    return nullptr;
  }
  const auto* e = find_device_engine<T, Optimizer>(d); // known, distributed: checked at start
  if (e == nullptr || !e->make_distributed)
    throw config_error("device " + d, "has no distributed engine", "give device host");
  std::string why;
  if (const int first = usable_everywhere(*e, why); first < comm.size())
    throw config_error("device " + d,
                       "no usable device on rank " + std::to_string(first) +
                           (comm.rank() == first ? ": " + why : std::string()),
                       "run one process per device where every rank has one, or give device "
                       "host (or auto)");
  return e;
}

/// The calibration line (rank 0): how long it took, the step's compute at full batch and what
/// of it does not shrink, the all-reduce of 1 MiB and how much of it hides behind compute.
inline void say_calibration(std::ostream& out, double seconds, const synth::compute_profile& p,
                            const cluster& c, const std::string& engine) {
  double step = 0.0;
  double fixed = 0.0;
  double weighted = 0.0; // the time of the ops measured at divided weights
  double weight_fixed = 0.0;
  for (std::size_t i = 0; i < p.seconds.size(); ++i) {
    step += p.seconds[i];
    if (!p.fixed.empty())
      fixed += p.seconds[i] * p.fixed[i];
    if (!p.weight_fixed.empty() && p.weight_fixed[i] >= 0.0) {
      weighted += p.seconds[i];
      weight_fixed += p.seconds[i] * p.weight_fixed[i];
    }
  }
  const auto percent = [](double part, double whole) {
    return std::to_string(static_cast<int>(std::lround(100.0 * part / whole)));
  };
  std::string fixed_text =
      p.fixed.empty() ? std::string()
                      : " (" + percent(fixed, step) +
                            "% of it not shrinking with the rows, measured at half the batch";
  if (weighted > 0.0)
    fixed_text += (fixed_text.empty() ? " (" : "; ") + percent(weight_fixed, weighted) +
                  "% of the weight-split ops' time not shrinking with the weight";
  if (!fixed_text.empty())
    fixed_text += ")";
  const auto ar = c.cost_model().params(collective::all_reduce, uneven_algorithm::native, 1 << 20);
  print(out,
        "calibrated in %.1f s: forward+backward %.2f ms at full batch on %s%s%s; "
        "all-reduce of 1 MiB %.3f ms, %.0f%% of it hidden behind compute\n",
        seconds, 1e3 * step, c.devices[0].name.c_str(),
        engine.empty() ? "" : (" (" + engine + ")").c_str(), fixed_text.c_str(),
        1e3 * (ar.alpha + ar.beta * (1 << 20)), 100.0 * c.overlap);
}

/// Calibration (see the file comment): rank 0 times the model's ops (at full and half batch,
/// and at the tensor-parallel baseline's pieces) where the run will compute, every rank the
/// collectives and their overlap; the results go into `run`'s profile and cluster. Collective.
template <std::floating_point T>
void calibrate(const graph::graph& g, const train_options& o, planned_run& run,
               mpi_communicator& comm, bool host, const std::string& engine,
               const std::function<synth::compute_profile(const graph::graph&, double,
                                                          const profile_options&)>& measure) {
  const auto c0 = std::chrono::steady_clock::now();
  profile_options po;
  po.seed = o.seed;
  po.slowdown = run.c.devices.at(0).slowdown;
  po.precision = o.precision;
  run.calibration = po;
  // The model at half the batch too: which part of each op's time a rank keeps whole when it
  // computes only some of the rows.
  std::optional<graph::graph> half;
  if (o.trace_at && o.batch >= 2)
    half = o.trace_at(o.batch / 2);
  // And at the pieces of a plan that divides the weights (the tensor-parallel baseline on two
  // of device 0): which part of each op's time a rank keeps whole when it holds only some of a
  // weight's columns or channels. (Host pieces only; none where no such plan is.)
  std::optional<synth::plan> by_weight;
  if (comm.rank() == 0 && host && run.c.size() > 1)
    by_weight = weight_splitting_plan(g, run.c, run.so);
  run.so.profile = measure_compute_on_rank0<T>(
      g, run.c.devices.at(0).speed, comm, po, measure, half ? &*half : nullptr,
      static_cast<double>(o.batch / 2) / static_cast<double>(o.batch),
      by_weight ? &*by_weight : nullptr);
  // Measured in the run's precision: GEMM times already hold device 0's 16-bit rate.
  run.so.profile->gemm_speed = run.c.devices.at(0).gemm_speed(o.precision != exec::precision::f32);
  // Its node times convert to work at device 0's class rates where the file has them.
  run.so.profile->rates = run.c.devices.at(0).rates;
  calibration_options co;
  for (graph::node_id w : g.parameters()) // its gradient may be a bucket of its own
    co.all_reduce_up_to = std::max(co.all_reduce_up_to, g[w].out.size() * sizeof(T));
  // No collective of this job moves more than its largest tensor (whole): sizes past the next
  // one up are not measured (a small model calibrates in a fraction of the time).
  std::size_t largest = 0;
  for (const graph::node& n : g.nodes())
    largest = std::max(largest, n.out.size() * sizeof(T));
  while (co.sizes_bytes.size() > 2 && co.sizes_bytes[co.sizes_bytes.size() - 2] >= largest)
    co.sizes_bytes.pop_back();
  run.c.set_collective_costs(calibrate_collectives(comm, co));
  run.c.overlap = measure_overlap(comm);
  if (comm.rank() == 0 && o.out != nullptr)
    say_calibration(*o.out,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count(),
                    *run.so.profile, run.c, measure ? engine : std::string());
}

/// MFU: every rank's peak flop/s (the cluster file's "peak", else a host rank's measured float
/// GEMM rate, stretched like its compute where it is emulated) and the FLOPs its own program
/// runs per micro-batch; rank 0 says which BLAS kernels the ranks run. Collective.
inline void share_peaks(flops_meter& meter, const graph::graph& g, const planned_run& run,
                        mpi_communicator& comm, bool host, std::ostream* out) {
  const std::size_t n = run.c.size();
  const auto me = static_cast<std::size_t>(comm.rank());
  const device_spec& dev = run.c.devices.at(me);
  constexpr std::size_t text_len = 64;
  std::vector<char> mine(text_len, '\0');
  double peak = dev.peak;
  if (host) {
    const blas::info& b = blas::status();
    if (peak <= 0.0)
      peak = b.sgemm_flops / std::max(1.0, dev.slowdown);
    const std::string t = (b.core.empty() ? std::string("?") : b.core) +
                          (b.warning.empty() ? "" : " (slower than the CPU allows)");
    std::copy_n(t.begin(), std::min(t.size(), text_len - 1), mine.begin());
  }
  const auto cost = graph::total_cost(program::lower(g, run.plan, me).local);
  std::vector<double> values(2 * n, 0.0);
  values[2 * me] = peak;
  values[2 * me + 1] = cost.forward_flops + cost.backward_flops;
  comm.all_reduce(std::span<double>(values), reduce_op::sum);
  std::vector<char> texts(text_len * n);
  comm.all_gather_v(std::span<const char>(mine), std::span<char>(texts),
                    std::vector<std::size_t>(n, text_len));
  meter.peaks.assign(n, 0.0);
  meter.rank_flops.assign(n, 0.0);
  meter.device_names.clear();
  for (std::size_t r = 0; r < n; ++r) {
    meter.peaks[r] = values[2 * r];
    meter.rank_flops[r] = values[2 * r + 1];
    meter.device_names.push_back(run.c.devices[r].name);
  }
  if (!host || comm.rank() != 0 || out == nullptr)
    return;
  std::string differing;
  const std::string first(texts.data());
  for (std::size_t r = 1; r < n; ++r)
    if (const std::string t(texts.data() + r * text_len); t != first)
      differing += " " + run.c.devices[r].name + " " + t + ";";
  if (!differing.empty())
    print(*out, "other ranks' BLAS kernels:%s\n", differing.c_str());
}

/// Starts this rank of a distributed run of `g` under `o` (see the file comment); `check`
/// checks the options once the ranks can report a failure together. Collective.
template <std::floating_point T, class Optimizer>
distributed_run<T, Optimizer> start_distributed(const graph::graph& g, train_options& o,
                                                const std::function<void()>& check) {
  // MPI is initialized once per process and finalized at exit (a second trainer, e.g. of
  // another plan, reuses it); a program that initialized MPI itself keeps ownership.
  static int argc = 0;
  static char** argv = nullptr;
  static const mpi_environment env(argc, argv);
  distributed_run<T, Optimizer> d;
  run_guarded([&] {
    auto w = std::make_unique<mpi_world>();
    mpi_communicator& comm = w->comm();
    w->set_phase("start-up (planning and agreement)");
    d.ranks = std::move(w);
    check();
    const bool is_root = comm.rank() == 0;
    // Every option that must match across ranks, compared before anything else collective: a
    // difference would hang (steps, calibration, buckets, tracing) or train silently wrong
    // (seed, learning rate, clipping, precision). HSPMD_DEBUG is compared by the communicator.
    std::vector<std::pair<std::string, std::string>> agreed = agreed_train_options(o);
    agreed.emplace_back("optimizer", typeid(Optimizer).name());
    agree_on_options(std::span<const std::pair<std::string, std::string>>(agreed), comm);
    planned_run& run = d.run;
    run.c = o.cluster_spec ? validated(*o.cluster_spec, o.cluster_spec->source.empty()
                                                            ? "train_options::cluster_spec"
                                                            : o.cluster_spec->source)
                           : load_cluster(o.cluster);
    check_rank_count(run.c, static_cast<std::size_t>(comm.size()));
    check_output_files(o, *d.ranks); // fail now, not after training
    check_checkpoint_dir(o, *d.ranks);
    if (is_root && !o.save_graph.empty())
      write_file(o.save_graph, graph::to_json(g).dump(1));
    if (!o.pipeline.empty()) { // stages on groups (train/pipeline_start.hpp)
      if (is_root && o.out != nullptr) {
        describe(*o.out, g, o, "host");
        say_blas(*o.out, blas::status());
      }
      d.pipeline = start_pipeline<T, Optimizer>(g, o, run.c, comm, is_root ? o.out : nullptr);
      d.meter = flops_meter(g, o.accumulate);
      return 0;
    }
    run.so = planning_options(o, sizeof(T));
    run.priced = priced_like(o, sizeof(T));
    // The device first: calibration measures rank 0's compute where the run will compute.
    const auto* device = distributed_device<T, Optimizer>(o.device, comm);
    if (device != nullptr && o.rebalance != 0.0)
      throw config_error("rebalance on device " + device->name,
                         "is built for host tensors only (a device engine's buffers and streams "
                         "are not moved yet)",
                         "drop --rebalance, or train on the host");
    // Emulated devices: the file's speeds and links describe another machine; measure this one
    // (unless a plan cache is asked for: a start from the cache is the point of one, and a
    // calibrated plan is not cached).
    if (o.calibrate.value_or(o.plan_cache.empty() &&
                             std::ranges::any_of(run.c.devices, [](const device_spec& s) {
                               return s.slowdown > 1.0;
                             })))
      calibrate<T>(g, o, run, comm, device == nullptr,
                   device != nullptr ? device->name : std::string(),
                   device != nullptr ? device->measure : decltype(device->measure){});
    std::string note;
    const double plan_seconds = choose_plan(g, o, run, *d.ranks, note);
    run.plan_seconds = plan_seconds;
    if (is_root && !o.save_plan.empty())
      write_file(o.save_plan, synth::to_json(run.plan).dump(1));
    if (is_root && o.out != nullptr) {
      describe(*o.out, g, o,
               device == nullptr ? std::string("host") : device->name + ", one device per rank");
      if (device == nullptr)
        say_blas(*o.out, blas::status());
      announce_plan(*o.out, g, o, run, plan_seconds, note);
    }
    if (device == nullptr)
      d.engine = std::make_unique<distributed_engine<T, Optimizer, mpi_communicator, host_backend>>(
          g, run.plan, comm, o.seed);
    else
      d.engine = device->make_distributed(g, run.plan, comm, o.seed);
    rank_engine<T, Optimizer>& e = *d.engine;
    e.set_slowdown(run.c.devices.at(static_cast<std::size_t>(comm.rank())).slowdown);
    if (o.bucket_mb > 0.0)
      e.set_bucket_bytes(static_cast<std::size_t>(o.bucket_mb * 1024.0 * 1024.0));
    e.set_profiling(o.profile);
    e.set_precision(o.precision);
    enable_recompute(e, g, o, is_root);
    if (is_root && o.out != nullptr)
      print(*o.out,
            "gradients: %.2f MiB on rank 0 in shared buffers (%.2f MiB with one per tensor "
            "version), on %s\n",
            static_cast<double>(e.gradient_bytes()) / 1048576.0,
            static_cast<double>(e.gradient_bytes_unshared()) / 1048576.0, e.device().c_str());
    d.meter = flops_meter(g, o.accumulate);
    share_peaks(d.meter, g, run, comm, device == nullptr, is_root ? o.out : nullptr);
    if (run.calibration && device == nullptr) {
      // The plan's ops at each rank's own pieces, for the simulated step: what a rank keeps
      // whole of an op whose rows or weight it divides is in them (train/profile.hpp).
      // (more repetitions than the profile: one plan's ops, and a short sample on a shared
      // machine once put Llama's simulated step 18 % over the run)
      const auto c0 = std::chrono::steady_clock::now();
      profile_options po = *run.calibration;
      po.repetitions = std::max<std::size_t>(po.repetitions, 7);
      run.shard_times = measure_shards_on_rank0<T>(g, run.plan, comm, po);
      if (is_root && o.out != nullptr)
        print(*o.out, "measured the plan's ops at every rank's pieces in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    }
    if (o.rebalance != 0.0)
      d.rebalance = start_rebalancing(g, o, run, *d.ranks);
    return 0;
  });
  return d;
}

} // namespace hspmd::train
