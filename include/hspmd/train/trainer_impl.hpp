#pragma once
// The library trainer's implementation (train/trainer.hpp has the declarations and the manual):
// the loop over an executor of one process or of one rank, planning, agreement, evaluation,
// progress, metrics and traces. Included by train/trainer.hpp unless HSPMD_COMPILED is defined;
// hspmd::compiled's src/trainer.cpp instantiates it once.

#include <hspmd/train/namespace.hpp>
#include <hspmd/train/trainer.hpp>

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/tracer.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/plan_cache.hpp>
#include <hspmd/synth/synthesize.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/fault.hpp>
#include <hspmd/train/loss_scale.hpp>
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/rebalance.hpp>

#if defined(HSPMD_HAS_MPI)
#include <hspmd/comm/calibrate.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/train/distributed_engine.hpp>
#include <hspmd/train/profile.hpp>
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

// printf-style checking of the trainer's line formatter.
#if defined(__GNUC__)
#define HSPMD_PRINTF_FORMAT(f, a) __attribute__((format(printf, f, a)))
#else
#define HSPMD_PRINTF_FORMAT(f, a)
#endif

namespace hspmd::train {

namespace detail {

/// "1.67x": a slowdown as the trace and the progress show it.
[[nodiscard]] inline std::string times_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3gx", x);
  return buf;
}

[[nodiscard]] inline std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

/// Everything a trainer holds and does (train/trainer.hpp declares the public face).
template <std::floating_point T, class Optimizer>
class trainer_state {
public:
  trainer_state(const model_fn& model, const train_options& o)
      : trainer_state(trace(model, o), with_trace_at(model, o)) {}
  trainer_state(graph::graph g, train_options o) : g_(std::move(g)), o_(std::move(o)) {
    // A model size of 0 (--seq 0, a width of 0) traces tensors of no elements, whose loss is a
    // mean over nothing: refused, not trained to a loss of 0.
    for (const graph::node& n : g_.nodes())
      if (n.out.size() == 0) {
        std::string shape;
        for (std::size_t d : n.out.dims)
          shape += (shape.empty() ? "(" : ", ") + std::to_string(d);
        throw config_error("model " + o_.name + ": " + n.name + " " + shape + ")",
                           "has no elements, so the step would train on nothing",
                           "give every size of the model (sequence length, widths, heads, "
                           "vocabulary) 1 or more");
      }
    for (const graph::node& n : g_.nodes())
      if (n.kind == graph::op::input && n.out.batch_dim) {
        o_.batch = n.out.dims[*n.out.batch_dim];
        break;
      }
    opt_ = make_optimizer();
    if (distributed() && o_.device != "host" && o_.device != "auto") { // before MPI starts
      const auto* e = find_device_engine<T, Optimizer>(o_.device);
      if (e == nullptr)
        (void)make_single_engine(); // the single process's error for an unknown device
      else if (!e->make_distributed)
        throw config_error("device " + o_.device, "trains one process only",
                           "give device host (or auto) with a cluster, or drop the cluster");
    }
    if (!distributed())
      start_single();
    else
      start_distributed();
  }
  trainer_state(const trainer_state&) = delete;
  trainer_state& operator=(const trainer_state&) = delete;

  /// The public trainer's callbacks (it owns them).
  void callbacks(const std::function<void(const step_report&)>* step,
                 const std::function<void(const eval_report&)>* eval) noexcept {
    on_step_ = step;
    on_eval_ = eval;
  }

  train_result fit(const feed_fn<T>& feed, const feed_fn<T>& eval) {
    return guarded([&] { return run(feed, eval); });
  }
  eval_report evaluate(const feed_fn<T>& eval, std::size_t batches, std::size_t after_step) {
    return guarded([&] { return run_eval(eval, batches, after_step); });
  }

  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }
  [[nodiscard]] const train_options& options() const noexcept { return o_; }
  [[nodiscard]] const std::optional<synth::plan>& plan() const noexcept { return plan_; }
  [[nodiscard]] executor<T>& local() {
    executor<T>* ex = engine_->host_executor();
    if (ex == nullptr)
      throw config_error("trainer::local()",
                         "the tensors live on " + engine_->device() + ", not in a host executor",
                         "read them with trainer::value(name), or train with device \"host\"");
    return *ex;
  }
  [[nodiscard]] std::string device() const { return engine_->device(); }
  [[nodiscard]] std::vector<T> value(std::string_view name) {
    for (graph::node_id id = 0; id < g_.size(); ++id)
      if (g_[id].name == name && g_[id].type != dtype::i64)
        return guarded([&] { return engine_->whole(id); });
    throw config_error("trainer::value(\"" + std::string(name) + "\")",
                       "names no floating-point node of the model",
                       "give a parameter's or a layer's name as the model set it");
  }
  [[nodiscard]] Optimizer& optimizer() noexcept { return opt_; }
  [[nodiscard]] bool root() const { return engine_->root(); }

private:
  static graph::graph trace(const model_fn& model, const train_options& o) {
    return trace_at(model, o.batch);
  }
  static graph::graph trace_at(const model_fn& model, std::size_t batch) {
    nn::tracer t(dtype_of<T>, batch);
    model(t);
    if (!t.graph().loss())
      throw plan_error("model function", "set no loss",
                       "end the model with tracer::set_loss(loss)");
    return t.take();
  }
  static train_options with_trace_at(const model_fn& model, train_options o) {
    if (!o.trace_at)
      o.trace_at = [model](std::size_t batch) { return trace_at(model, batch); };
    return o;
  }

  [[nodiscard]] bool distributed() const { return !o_.cluster.empty() || o_.cluster_spec; }

  Optimizer make_optimizer() const {
    if constexpr (std::is_same_v<Optimizer, adam>)
      return adam(o_.lr.peak, 0.9, 0.999, 1e-8, o_.weight_decay);
    else
      return Optimizer(o_.lr.peak);
  }

  // Every option checked before any work: one line naming the option and the fix.
  void check_options() {
    fault_ = fault_from_env();
    if (fault_ && !fault_->save_point.empty() &&
        (fault_->what == fault_spec::kind::slow || o_.save_every == 0 ||
         (fault_->step % o_.save_every != 0 && fault_->step != o_.steps) ||
         fault_->step > o_.steps))
      throw config_error("HSPMD_FAULT " + fault_->kind_text() + " at " + fault_->where(),
                         "strikes during a save this run does not make (or is slow, which "
                         "applies from a step on)",
                         "give at:saveN:POINT with N a step --save-every saves at");
    if (fault_ && fault_->what == fault_spec::kind::slow && !distributed())
      throw config_error("HSPMD_FAULT " + fault_->kind_text(),
                         "slows a rank of a distributed run; one process has no peers to wait",
                         "give a cluster, or another kind");
    if (!o_.plan_cache.empty() && !o_.plan.empty() && o_.plan != "synth")
      throw config_error("plan cache " + o_.plan_cache,
                         "keeps synthesized plans, and plan " + o_.plan + " is not synthesized",
                         "drop the plan cache, or give plan synth");
    if (o_.batch == 0)
      throw config_error("batch 0", "a training step needs at least one sample",
                         "give a batch of 1 or more");
    if (o_.accumulate == 0)
      throw config_error("accumulate 0", "a step needs at least one micro-batch",
                         "give 1 (no accumulation) or more");
    if (o_.eval_batches == 0)
      throw config_error("eval batches 0", "an evaluation needs at least one micro-batch",
                         "give 1 or more");
    // Every number within its range; in one process, nothing that needs a cluster
    // (train/option_table.hpp).
    check_train_options(o_, distributed());
    if (!(o_.lr.peak > 0.0) || o_.lr.floor < 0.0 || o_.lr.floor > o_.lr.peak)
      throw config_error("learning rate " + std::to_string(o_.lr.peak),
                         "needs 0 < lr and 0 <= floor <= lr", "give a positive learning rate");
    if (o_.precision != exec::precision::f32 && !std::is_same_v<T, float>)
      throw config_error("precision " + std::string(name(o_.precision)),
                         "needs a model of float (16-bit activations, float master weights)",
                         "give precision f32, or trace the model in float");
    if (o_.rebalance != 0.0) {
      if (!(o_.rebalance > 1.0) || !std::isfinite(o_.rebalance))
        throw config_error("rebalance " + std::to_string(o_.rebalance),
                           "is how many times slower than the others a device must be before "
                           "the run re-balances, so it must exceed 1",
                           "give e.g. 1.25, or 0 to turn re-balancing off");
      if (o_.rebalance_window == 0)
        throw config_error("rebalance window 0", "re-balancing compares the median of steps",
                           "give a window of 1 or more steps");
      if (o_.plan == "dp-ev")
        throw config_error("rebalance with plan dp-ev",
                           "dp-ev shares the batch evenly by definition, and re-balancing "
                           "changes the shares",
                           "give plan dp-cp or synth (or drop --rebalance)");
      if constexpr (!requires(Optimizer & x) { x.state(); })
        throw config_error("rebalance with optimizer " + std::string(typeid(Optimizer).name()),
                           "keeps its state private, so re-balancing cannot move it",
                           "train with exec::adam or exec::sgd, or drop --rebalance");
    }
    if ((o_.save_every > 0 || o_.resume) && o_.checkpoint_dir.empty())
      throw config_error(o_.resume ? "resume" : "save every " + std::to_string(o_.save_every),
                         "needs the directory checkpoints live in",
                         "give a checkpoint directory (--checkpoint-dir DIR)");
    if constexpr (!requires(Optimizer & x) { x.state(); })
      if (o_.save_every > 0 || o_.resume)
        throw config_error("checkpoints with optimizer " + std::string(typeid(Optimizer).name()),
                           "keeps its state private, so a checkpoint cannot hold it",
                           "train with exec::adam or exec::sgd");
  }

  void start_single() {
    check_options();
    if (o_.save_graph.size() > 0)
      write_file(o_.save_graph, graph::to_json(g_).dump(1));
    engine_ = make_single_engine();
    engine_->set_profiling(o_.profile);
    engine_->set_precision(o_.precision);
    recompute(*engine_, true);
    const auto cost = graph::total_cost(g_);
    rank_flops_ = {cost.forward_flops + cost.backward_flops};
    device_names_ = {engine_->device()};
    peaks_ = {0.0};
    const bool host = engine_->device() == "host";
    if (host) // the float GEMM's measured rate: what MFU is reported against
      peaks_[0] = blas::status().sgemm_flops;
    if (o_.out != nullptr) {
      describe(*o_.out, engine_->device());
      if (host)
        say_blas(*o_.out, blas::status());
      if (o_.print_graph)
        graph::print(*o_.out, g_);
    }
  }

  // The start-up line of what runs the host GEMMs, and its warning when it is slower than the
  // CPU allows.
  static void say_blas(std::ostream& out, const blas::info& b) {
    out << blas::describe(b) << "\n";
    if (!b.warning.empty())
      out << "warning: " << b.warning << "\n";
  }

  // The engine of one process on the device the options name: "host"; a registered device
  // engine ("cuda" where hspmd::cuda is linked, train/engine.hpp); or "auto", the first
  // registered engine that finds a device, else the host.
  std::unique_ptr<engine<T, Optimizer>> make_single_engine() const {
    const std::string& d = o_.device;
    if (d == "auto")
      for (const auto& e : device_engines<T, Optimizer>()) {
        std::string why;
        if (e.probe(why) > 0)
          return e.make(g_, o_.seed);
      }
    if (d == "auto" || d == "host")
      return std::make_unique<backend_engine<T, Optimizer, host_backend>>(g_, o_.seed);
    const auto* e = find_device_engine<T, Optimizer>(d);
    if (e == nullptr) {
      std::string known = "host, auto";
      for (const auto& k : device_engines<T, Optimizer>())
        known += ", " + k.name;
      throw config_error("device " + d,
                         d == "cuda" ? "this program is not linked with hspmd::cuda (built where "
                                       "CMake finds nvcc and the CUDA toolkit)"
                                     : "is not a device this program knows (" + known + ")",
                         d == "cuda" ? "link hspmd::cuda into the program, or give device host"
                                     : "give one of: " + known);
    }
    std::string why;
    if (e->probe(why) <= 0)
      throw config_error("device " + d, "no usable device: " + why,
                         "run where a GPU is visible, or give device host (or auto)");
    return e->make(g_, o_.seed);
  }

  template <class F>
  auto guarded(F&& body) {
#if defined(HSPMD_HAS_MPI)
    if (distributed()) {
      using R = decltype(body());
      std::optional<R> r;
      run_guarded([&] {
        r.emplace(body());
        return 0;
      });
      return std::move(*r);
    }
#endif
    return body();
  }

  void start_distributed() {
#if defined(HSPMD_HAS_MPI)
    // MPI is initialized once per process and finalized at exit (a second trainer, e.g. of
    // another plan, reuses it); a program that initialized MPI itself keeps ownership.
    static int argc = 0;
    static char** argv = nullptr;
    static const mpi_environment env(argc, argv);
    guarded([&] {
      comm_ = std::make_unique<mpi_communicator>();
      // Training bounds every wait (comm/watchdog.hpp): HSPMD_TIMEOUT, else 300 s.
      comm_->set_timeout(timeout_from_env(default_training_timeout));
      comm_->set_phase("start-up (planning and agreement)");
      check_options();
      plan_and_materialize();
      return 0;
    });
#else
    throw config_error("cluster " + o_.cluster, "this build of hspmd has no MPI backend",
                       "link hspmd::mpi (or hspmd::hspmd) with MPI installed, or drop the cluster");
#endif
  }

#if defined(HSPMD_HAS_MPI)
  void plan_and_materialize() {
    namespace synth = hspmd::synth;
    mpi_communicator& comm = *comm_;
    const bool is_root = comm.rank() == 0;
    agree_on_training_options(comm);
    cluster_ = o_.cluster_spec ? validated(*o_.cluster_spec, o_.cluster_spec->source.empty()
                                                                 ? "train_options::cluster_spec"
                                                                 : o_.cluster_spec->source)
                               : load_cluster(o_.cluster);
    check_rank_count(cluster_, static_cast<std::size_t>(comm.size()));
    for (const auto& [what, path] : {std::pair<const char*, const std::string*>{"trace", &o_.trace},
                                     {"plan", &o_.save_plan},
                                     {"graph", &o_.save_graph},
                                     {"metrics", &o_.metrics}})
      if (!path->empty()) { // fail now, not after training
        std::int32_t ok = 1;
        if (is_root)
          ok = std::ofstream(*path, std::ios::app).good() ? 1 : 0;
        comm.broadcast(std::span<std::int32_t>(&ok, 1), 0);
        if (ok == 0)
          throw config_error(std::string(what) + " file " + *path, "cannot be written",
                             "give a path in an existing, writable directory");
      }
    if (is_root && !o_.save_graph.empty())
      write_file(o_.save_graph, graph::to_json(g_).dump(1));
    synth::synth_options& so = so_;
    so.gemm_type = o_.precision == exec::precision::bf16  ? dtype::bf16
                   : o_.precision == exec::precision::f16 ? dtype::f16
                                                          : dtype::f32;
    if (o_.recompute) // planned with it: its replays priced, its memory counted
      so.search.recompute = synth::search_options::recomputation::always;
    if (!o_.rank_by_cost) {
      sim::options judged;
      judged.element_bytes = sizeof(T);
      if (o_.bucket_mb > 0.0)
        judged.bucket_bytes = o_.bucket_mb * 1024.0 * 1024.0;
      so.judge = sim::judge(judged);
    }
    // The device first: calibration measures rank 0's compute where the run will compute.
    const auto* device_entry = distributed_device(comm);
    if (device_entry != nullptr && o_.rebalance != 0.0)
      throw config_error("rebalance on device " + device_entry->name,
                         "is built for host tensors only (a device engine's buffers and streams "
                         "are not moved yet)",
                         "drop --rebalance, or train on the host");
    // Emulated devices: the file's speeds and links describe another machine; measure this one
    // (unless a plan cache is asked for: a start from the cache is the point of one, and a
    // calibrated plan is not cached).
    const bool calibrate = o_.calibrate.value_or(
        o_.plan_cache.empty() && std::ranges::any_of(cluster_.devices, [](const device_spec& d) {
          return d.slowdown > 1.0;
        }));
    if (calibrate) {
      const auto c0 = std::chrono::steady_clock::now();
      profile_options po;
      po.seed = o_.seed;
      po.slowdown = cluster_.devices.at(0).slowdown;
      po.precision = o_.precision;
      calibration_ = po;
      // The model at half the batch too: which part of each op's time a rank keeps whole
      // when it computes only some of the rows.
      std::optional<graph::graph> half;
      if (o_.trace_at && o_.batch >= 2)
        half = o_.trace_at(o_.batch / 2);
      // And at the pieces of a plan that divides the weights (the tensor-parallel baseline on
      // two of device 0): which part of each op's time a rank keeps whole when it holds only
      // some of a weight's columns or channels. (Host pieces only; none where no such plan is.)
      std::optional<synth::plan> by_weight;
      if (is_root && device_entry == nullptr && cluster_.size() > 1)
        by_weight = weight_splitting_plan();
      so.profile = measure_compute_on_rank0<T>(
          g_, cluster_.devices.at(0).speed, comm, po,
          device_entry != nullptr ? device_entry->measure : decltype(device_entry->measure){},
          half ? &*half : nullptr,
          static_cast<double>(o_.batch / 2) / static_cast<double>(o_.batch),
          by_weight ? &*by_weight : nullptr);
      // Measured in the run's precision: GEMM times already hold device 0's 16-bit rate.
      so.profile->gemm_speed =
          cluster_.devices.at(0).gemm_speed(o_.precision != exec::precision::f32);
      // Its node times convert to work at device 0's class rates where the file has them.
      so.profile->rates = cluster_.devices.at(0).rates;
      calibration_options co;
      for (graph::node_id w : g_.parameters()) // its gradient may be a bucket of its own
        co.all_reduce_up_to = std::max(co.all_reduce_up_to, g_[w].out.size() * sizeof(T));
      // No collective of this job moves more than its largest tensor (whole): sizes past the
      // next one up are not measured (a small model calibrates in a fraction of the time).
      std::size_t largest = 0;
      for (const graph::node& n : g_.nodes())
        largest = std::max(largest, n.out.size() * sizeof(T));
      while (co.sizes_bytes.size() > 2 && co.sizes_bytes[co.sizes_bytes.size() - 2] >= largest)
        co.sizes_bytes.pop_back();
      cluster_.set_collective_costs(calibrate_collectives(comm, co));
      cluster_.overlap = measure_overlap(comm);
      if (is_root && o_.out != nullptr) {
        double step = 0.0;
        double fixed = 0.0;
        double weighted = 0.0; // the time of the ops measured at divided weights
        double weight_fixed = 0.0;
        for (std::size_t i = 0; i < so.profile->seconds.size(); ++i) {
          step += so.profile->seconds[i];
          if (!so.profile->fixed.empty())
            fixed += so.profile->seconds[i] * so.profile->fixed[i];
          if (!so.profile->weight_fixed.empty() && so.profile->weight_fixed[i] >= 0.0) {
            weighted += so.profile->seconds[i];
            weight_fixed += so.profile->seconds[i] * so.profile->weight_fixed[i];
          }
        }
        const auto percent = [](double part, double whole) {
          return std::to_string(static_cast<int>(std::lround(100.0 * part / whole)));
        };
        std::string fixed_text =
            so.profile->fixed.empty()
                ? std::string()
                : " (" + percent(fixed, step) +
                      "% of it not shrinking with the rows, measured at half the batch";
        if (weighted > 0.0)
          fixed_text += (fixed_text.empty() ? " (" : "; ") + percent(weight_fixed, weighted) +
                        "% of the weight-split ops' time not shrinking with the weight";
        if (!fixed_text.empty())
          fixed_text += ")";
        const auto ar =
            cluster_.cost_model().params(collective::all_reduce, uneven_algorithm::native, 1 << 20);
        print(*o_.out,
              "calibrated in %.1f s: forward+backward %.2f ms at full batch on %s%s%s; "
              "all-reduce of 1 MiB %.3f ms, %.0f%% of it hidden behind compute\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count(),
              1e3 * step, cluster_.devices[0].name.c_str(),
              device_entry != nullptr && device_entry->measure
                  ? (" (" + device_entry->name + ")").c_str()
                  : "",
              fixed_text.c_str(), 1e3 * (ar.alpha + ar.beta * (1 << 20)), 100.0 * cluster_.overlap);
      }
    }
    const std::string which = o_.plan.empty() ? "synth" : o_.plan;
    const auto t0 = std::chrono::steady_clock::now();
    std::string cache_note;
    if (which == "synth" && !o_.plan_cache.empty())
      plan_ = cached_plan(comm, so, cache_note);
    else if (which == "synth")
      plan_ = synth::synthesize(g_, cluster_, so, o_.name);
    else if (which == "dp-ev")
      plan_ = synth::make_baseline(g_, cluster_, synth::baseline::dp_ev, so, o_.name);
    else if (which == "dp-cp")
      plan_ = synth::make_baseline(g_, cluster_, synth::baseline::dp_cp, so, o_.name);
    else if (which == "tp")
      plan_ = synth::make_baseline(g_, cluster_, synth::baseline::tp, so, o_.name);
    else
      plan_ = synth::load_plan(which, g_);
    if (o_.recompute && !plan_->recompute && !scope_segments(g_).empty()) {
      plan_->recompute = true; // a plan file made without it: priced with it
      synth::evaluate(*plan_, cost_model_for(cluster_), plan_->ratios);
    }
    o_.recompute = o_.recompute || plan_->recompute; // the plan's memory counts on it
    const double plan_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (is_root && !o_.save_plan.empty())
      write_file(o_.save_plan, synth::to_json(*plan_).dump(1));
    if (is_root && o_.out != nullptr) {
      std::ostream& out = *o_.out;
      describe(out, device_entry == nullptr ? std::string("host")
                                            : device_entry->name + ", one device per rank");
      if (device_entry == nullptr)
        say_blas(out, blas::status());
      print(out, "cluster \"%s\" (%zu ranks); plan %s (%.0f ms%s): predicted step %s; shares",
            cluster_.name.c_str(), cluster_.size(), plan_->strategy.c_str(), 1e3 * plan_seconds,
            cache_note.c_str(), synth::milliseconds_text(plan_->step_time).c_str());
      for (std::size_t d = 0; d < plan_->device_names.size(); ++d)
        print(out, " %s %.1f%%", plan_->device_names[d].c_str(), 100.0 * plan_->ratios[0][d]);
      out << "\n";
      if (plan_->stats.reranked)
        print(out,
              "(picked by the simulated step: the cost model's own pick, predicted %s, simulates "
              "to %s; this plan to %s; --rank-by-cost keeps the cost model's)\n",
              synth::seconds_text(plan_->stats.model_pick_step).c_str(),
              synth::seconds_text(plan_->stats.model_pick_judged).c_str(),
              synth::seconds_text(plan_->stats.judged_step).c_str());
      if (o_.print_graph)
        graph::print(out, g_);
      if (o_.explain)
        out << synth::explain(*plan_, cost_model_for(cluster_));
    }
    std::unique_ptr<rank_engine<T, Optimizer>> e;
    if (device_entry == nullptr)
      e = std::make_unique<distributed_engine<T, Optimizer, mpi_communicator, host_backend>>(
          g_, *plan_, comm, o_.seed);
    else
      e = device_entry->make_distributed(g_, *plan_, comm, o_.seed);
    e->set_slowdown(cluster_.devices.at(static_cast<std::size_t>(comm.rank())).slowdown);
    if (o_.bucket_mb > 0.0)
      e->set_bucket_bytes(static_cast<std::size_t>(o_.bucket_mb * 1024.0 * 1024.0));
    e->set_profiling(o_.profile);
    e->set_precision(o_.precision);
    recompute(*e, is_root);
    if (is_root && o_.out != nullptr)
      print(*o_.out,
            "gradients: %.2f MiB on rank 0 in shared buffers (%.2f MiB with one per tensor "
            "version), on %s\n",
            static_cast<double>(e->gradient_bytes()) / 1048576.0,
            static_cast<double>(e->gradient_bytes_unshared()) / 1048576.0, e->device().c_str());
    dist_ = e.get();
    engine_ = std::move(e);
    share_peaks(comm, device_entry == nullptr);
    if (calibration_ && device_entry == nullptr) {
      // The plan's ops at each rank's own pieces, for the simulated step: what a rank keeps
      // whole of an op whose rows or weight it divides is in them (train/profile.hpp).
      // (more repetitions than the profile: one plan's ops, and a short sample on a shared
      // machine once put Llama's simulated step 18 % over the run)
      const auto c0 = std::chrono::steady_clock::now();
      profile_options po = *calibration_;
      po.repetitions = std::max<std::size_t>(po.repetitions, 7);
      shard_times_ = measure_shards_on_rank0<T>(g_, *plan_, comm, po);
      if (is_root && o_.out != nullptr)
        print(*o_.out, "measured the plan's ops at every rank's pieces in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    }
    if (o_.rebalance != 0.0)
      start_monitor(comm);
  }

  // MFU: every rank's peak flop/s (the cluster file's "peak", else a host rank's measured float
  // GEMM rate, stretched like its compute where it is emulated) and the FLOPs its own program
  // runs per micro-batch; rank 0 says which BLAS kernels the ranks run. Collective.
  void share_peaks(mpi_communicator& comm, bool host) {
    const std::size_t n = cluster_.size();
    const auto me = static_cast<std::size_t>(comm.rank());
    const device_spec& dev = cluster_.devices.at(me);
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
    const auto cost = graph::total_cost(program::lower(g_, *plan_, me).local);
    std::vector<double> values(2 * n, 0.0);
    values[2 * me] = peak;
    values[2 * me + 1] = cost.forward_flops + cost.backward_flops;
    comm.all_reduce(std::span<double>(values), reduce_op::sum);
    std::vector<char> texts(text_len * n);
    comm.all_gather_v(std::span<const char>(mine), std::span<char>(texts),
                      std::vector<std::size_t>(n, text_len));
    peaks_.assign(n, 0.0);
    rank_flops_.assign(n, 0.0);
    device_names_.clear();
    for (std::size_t r = 0; r < n; ++r) {
      peaks_[r] = values[2 * r];
      rank_flops_[r] = values[2 * r + 1];
      device_names_.push_back(cluster_.devices[r].name);
    }
    if (!host || comm.rank() != 0 || o_.out == nullptr)
      return;
    std::string differing;
    const std::string first(texts.data());
    for (std::size_t r = 1; r < n; ++r)
      if (const std::string t(texts.data() + r * text_len); t != first)
        differing += " " + cluster_.devices[r].name + " " + t + ";";
    if (!differing.empty())
      print(*o_.out, "other ranks' BLAS kernels:%s\n", differing.c_str());
  }

  // Re-balancing: the plan's predictions per device, and (rank 0) the ratio LP's basis for
  // the first warm re-solve.
  void start_monitor(mpi_communicator& comm) {
    monitor_.emplace(rebalance_options{o_.rebalance, o_.rebalance_window},
                     evaluated(*plan_, cluster_).device_compute);
    if (comm.rank() == 0)
      if (auto r = synth::resolve_ratios(*plan_, cost_model_for(cluster_), cluster_))
        basis_ = std::move(r->basis);
  }

  [[nodiscard]] synth::cost_model cost_model_for(const cluster& c) const {
    return synth::cost_model(g_, c, synth::segment_map(g_, plan_->segments), so_.profile,
                             so_.gemm_type);
  }
  // Plan `p` (its program at its ratios) with its predictions for cluster `c`.
  [[nodiscard]] synth::plan evaluated(synth::plan p, const cluster& c) const {
    synth::evaluate(p, cost_model_for(c), p.ratios);
    return p;
  }

  // After step `s`: the ranks share their compute seconds; when the monitor sees a device off
  // its modelled speed, rank 0 re-solves the ratios at the measured speeds (warm), every rank
  // takes that plan and moves its state to the new pieces. Collective.
  void maybe_rebalance(std::size_t s, train_result& r, std::ofstream& metrics) {
    using clock = std::chrono::steady_clock;
    mpi_communicator& comm = *comm_;
    const double mine = dist_->take_compute_seconds();
    std::vector<double> all(static_cast<std::size_t>(comm.size()));
    comm.all_gather_v(std::span<const double>(&mine, 1), std::span<double>(all),
                      std::vector<std::size_t>(all.size(), 1), uneven_algorithm::native);
    const auto factors = monitor_->observe(all);
    if (!factors)
      return;
    set_phase("re-balancing after step " + std::to_string(s + 1));
    const auto t0 = clock::now();
    cluster measured = measured_cluster(cluster_, *factors);
    rebalance_report rep;
    rep.after_step = s + 1;
    rep.factors = *factors;
    rep.shares_before = plan_->ratios.at(0);
    std::string text;
    if (comm.rank() == 0) {
      const auto l0 = clock::now();
      auto res = synth::resolve_ratios(*plan_, cost_model_for(measured), measured,
                                       basis_.variables.empty() ? nullptr : &basis_);
      rep.solve_seconds = std::chrono::duration<double>(clock::now() - l0).count();
      if (res) {
        rep.lp_iterations = res->iterations;
        rep.warm = res->warm;
        basis_ = std::move(res->basis);
        text = synth::to_json(res->p).dump();
      }
    }
    std::array<double, 3> facts{rep.solve_seconds, static_cast<double>(rep.lp_iterations),
                                rep.warm ? 1.0 : 0.0};
    comm.broadcast(std::span<double>(facts), 0);
    rep.solve_seconds = facts[0];
    rep.lp_iterations = static_cast<std::size_t>(facts[1]);
    rep.warm = facts[2] != 0.0;
    broadcast_text(comm, text);
    std::ostream* out = comm.rank() == 0 ? o_.out : nullptr;
    if (text.empty()) { // not optimal: keep the plan, measure again
      if (out != nullptr)
        print(*out,
              "re-balancing after step %zu: the ratio LP at the measured speeds is not "
              "optimal; the plan stays\n",
              s + 1);
      monitor_->restart(evaluated(*plan_, cluster_).device_compute);
      return;
    }
    synth::plan next = synth::plan_from_json(nlohmann::json::parse(text), g_, "re-balanced plan");
    rep.predicted_before = evaluated(*plan_, measured).step_time;
    rep.predicted_after = next.step_time;
    rep.shares_after = next.ratios.at(0);
    // Moved only when some share changes (the same ratios lower to the same pieces).
    rep.moved = next.ratios != plan_->ratios;
    if (rep.moved) {
      const auto m0 = clock::now();
      dist_->rebalance(next, opt_);
      rep.move_seconds = std::chrono::duration<double>(clock::now() - m0).count();
      rep.move_seconds = dist_->slowest(rep.move_seconds);
    }
    cluster_ = std::move(measured);
    plan_ = std::move(next);
    shard_times_.reset(); // measured at the old pieces
    monitor_->restart(plan_->device_compute);
    const auto t1 = clock::now();
    nlohmann::json args{{"after_step", rep.after_step},
                        {"factors", rep.factors},
                        {"shares_before", rep.shares_before},
                        {"shares_after", rep.shares_after},
                        {"solve_ms", 1e3 * rep.solve_seconds},
                        {"lp_iterations", rep.lp_iterations},
                        {"warm", rep.warm},
                        {"move_ms", 1e3 * rep.move_seconds}};
    dist_->trace_event(rep.moved ? "re-balance" : "re-balance (shares unchanged)", t0, t1, args);
    if (metrics.is_open())
      metrics << nlohmann::json{{"rebalance", args}}.dump() << "\n";
    if (out != nullptr) {
      std::size_t worst = 0;
      for (std::size_t d = 0; d < rep.factors.size(); ++d)
        if (rep.factors[d] > rep.factors[worst])
          worst = d;
      print(*out,
            "re-balanced after step %zu: %s computes %.2fx slower than the others relative to "
            "the plan; ratios re-solved in %.1f ms (%zu LP iterations%s); shares",
            s + 1, plan_->device_names[worst].c_str(), rep.factors[worst], 1e3 * rep.solve_seconds,
            rep.lp_iterations, rep.warm ? " from the last basis" : "");
      for (std::size_t d = 0; d < rep.shares_after.size(); ++d)
        print(*out, " %s %.1f%% -> %.1f%%", plan_->device_names[d].c_str(),
              100.0 * rep.shares_before[d], 100.0 * rep.shares_after[d]);
      if (rep.moved)
        print(*out, "; predicted step %s -> %s; state moved in %.1f ms\n",
              synth::milliseconds_text(rep.predicted_before).c_str(),
              synth::milliseconds_text(rep.predicted_after).c_str(), 1e3 * rep.move_seconds);
      else
        print(*out, " (unchanged: nothing moved)\n");
      out->flush();
    }
    r.rebalances.push_back(std::move(rep));
  }
#endif

#if defined(HSPMD_HAS_MPI)
  // The device engine of every rank (nullptr: the host), agreed by all: "host"; a registered
  // engine that trains distributed and finds a device on every rank; "auto": such an engine if
  // every rank has a device for it, else the host. Collective.
  const device_engine_entry<T, Optimizer>* distributed_device(mpi_communicator& comm) const {
    const std::string& d = o_.device;
    if (d == "host")
      return nullptr;
    const auto usable_everywhere = [&](const device_engine_entry<T, Optimizer>& e,
                                       std::string& why) {
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
#endif

#if defined(HSPMD_HAS_MPI)
  // The plan through the plan cache: rank 0 looks up, re-solves or synthesizes (ranks may see
  // different directories) and broadcasts the plan's JSON. Collective.
  synth::plan cached_plan(mpi_communicator& comm, const synth::synth_options& so,
                          std::string& note) {
    std::string text;
    if (comm.rank() == 0) {
      const auto c = synth::synthesize_cached(g_, cluster_, so, o_.name, o_.plan_cache);
      text = synth::to_json(c.p).dump();
      char b[160];
      switch (c.outcome) {
      case synth::cache_outcome::hit:
        note = ", from the plan cache: synthesis skipped";
        break;
      case synth::cache_outcome::resolved:
        std::snprintf(b, sizeof b,
                      ", from the plan cache: the cluster's numbers changed, ratios re-solved "
                      "for the cached program in %zu LP iterations%s",
                      c.lp_iterations, c.warm ? " from its basis" : "");
        note = b;
        break;
      case synth::cache_outcome::miss:
        note = ", synthesized and stored in the plan cache";
        break;
      case synth::cache_outcome::uncached:
        note = ", calibrated: not cached";
        break;
      }
      if (!c.file.empty())
        note += " (" + c.file.string() + ")";
    }
    broadcast_text(comm, text);
    return synth::plan_from_json(nlohmann::json::parse(text), g_, "the plan from rank 0");
  }

  // Rank 0's `text` on every rank. Collective.
  static void broadcast_text(mpi_communicator& comm, std::string& text) {
    auto size = static_cast<std::uint64_t>(text.size());
    comm.broadcast(std::span<std::uint64_t>(&size, 1), 0);
    text.resize(static_cast<std::size_t>(size));
    comm.broadcast(std::span<char>(text), 0);
  }

  // Every option that must match across ranks, compared before anything else collective: a
  // difference would hang (steps, calibration, buckets, tracing) or train silently wrong
  // (seed, learning rate, clipping, precision). HSPMD_DEBUG is compared by the communicator.
  // Collective.
  void agree_on_training_options(mpi_communicator& comm) const {
    std::vector<std::pair<std::string, std::string>> options = agreed_train_options(o_);
    options.emplace_back("optimizer", typeid(Optimizer).name());
    agree_on_options(std::span<const std::pair<std::string, std::string>>(options), comm);
  }
#endif

  static void print(std::ostream& out, const char* format, ...) HSPMD_PRINTF_FORMAT(2, 3) {
    char line[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(line, sizeof line, format, args);
    va_end(args);
    out << line;
  }

  static void write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path);
    f << text << "\n";
    if (!f)
      throw config_error(path, "cannot be written",
                         "give a path in an existing, writable directory");
  }

  void describe(std::ostream& out, const std::string& device) const {
    std::size_t params = 0;
    for (auto id : g_.parameters())
      params += g_[id].out.size();
    const auto cost = graph::total_cost(g_);
    print(out,
          "%s: %zu parameters, %zu graph nodes, %.3f GFLOP per micro-batch of %zu (forward %.3f, "
          "backward %.3f), %zu micro-batch%s per step, on %s\n",
          o_.name.c_str(), params, g_.size(), (cost.forward_flops + cost.backward_flops) / 1e9,
          o_.batch, cost.forward_flops / 1e9, cost.backward_flops / 1e9, o_.accumulate,
          o_.accumulate == 1 ? "" : "es", device.c_str());
    if (o_.precision != exec::precision::f32)
      print(out,
            "precision %s: activations and GEMM operands in 16 bits, master weights, their "
            "gradients and reductions in float%s\n",
            std::string(name(o_.precision)).c_str(),
            o_.precision == exec::precision::f16 ? ", dynamic loss scaling" : "");
  }

  // Activation recomputation when asked for; `say`: print what it keeps (rank 0).
  template <class E>
  void recompute(E& e, bool say) {
    if (!o_.recompute)
      return;
    if (scope_segments(g_).empty()) // the whole graph: the same answer on every rank
      throw config_error("--recompute", "the model has no blocks to recompute",
                         "name block parameters \"layers.<k>.\" (the zoo's models do), or drop "
                         "--recompute");
    const std::size_t bytes = e.recompute();
    if (say && o_.out != nullptr)
      print(*o_.out,
            "recompute: each block's activations made again in the backward; %.2f MiB "
            "hold one block's at a time\n",
            static_cast<double>(bytes) / (1024.0 * 1024.0));
  }

  // What this rank is doing, named if a wait times out.
  void set_phase([[maybe_unused]] std::string phase) {
#if defined(HSPMD_HAS_MPI)
    if (comm_)
      comm_->set_phase(std::move(phase));
#endif
  }
  [[nodiscard]] int rank() const {
#if defined(HSPMD_HAS_MPI)
    if (comm_)
      return comm_->rank();
#endif
    return 0;
  }
  // HSPMD_FAULT's fault on this rank (train/fault.hpp); only `slow` returns.
  void inject(const fault_spec& f) {
    inject_fault(f);
#if defined(HSPMD_HAS_MPI)
    if (dist_ != nullptr)
      dist_->set_slowdown(cluster_.devices.at(static_cast<std::size_t>(rank())).slowdown *
                          f.factor);
#endif
  }

  // The loop (see the file comment); every rank runs it in step.
  train_result run(const feed_fn<T>& feed, const feed_fn<T>& eval) {
    using clock = std::chrono::steady_clock;
    engine<T, Optimizer>& e = *engine_;
    const bool is_root = e.root();
    std::ostream* out = is_root ? o_.out : nullptr;
    std::ofstream metrics;
    if (is_root && !o_.metrics.empty()) {
      metrics.open(o_.metrics);
      if (!metrics)
        throw config_error(o_.metrics, "cannot be written",
                           "give a path in an existing, writable directory");
    }
#if defined(HSPMD_HAS_MPI)
    rank_engine<T, Optimizer>* dist = dist_;
    if (dist != nullptr && !o_.trace.empty())
      dist->start_trace();
#endif
    train_result r;
    if (plan_) {
      r.predicted_step_seconds = plan_->step_time;
#if defined(HSPMD_HAS_MPI)
      sim::options so;
      so.element_bytes = sizeof(T);
      if (o_.bucket_mb > 0.0)
        so.bucket_bytes = o_.bucket_mb * 1024.0 * 1024.0;
      so.measured = shard_times_ ? &*shard_times_ : nullptr;
      r.simulated_step_seconds = sim::simulate(*plan_, cost_model_for(cluster_), so).step_time;
#endif
    }
    const std::size_t every =
        o_.log_every > 0 ? o_.log_every : std::max<std::size_t>(1, o_.steps / 20);
    double elapsed = 0.0;
    // f16: gradients are computed scaled (train/loss_scale.hpp); every rank sees the same
    // all-reduced norm, so all skip the same steps.
    std::optional<dynamic_loss_scale> loss_scale;
    if (o_.precision == exec::precision::f16)
      loss_scale.emplace();
    std::optional<std::size_t> resumed;
    if (o_.resume)
      resumed = resume(e, r, loss_scale, out);
    if (!resumed && !o_.init_from.empty())
      initialize_from(e, r, out);
    const std::size_t first = resumed.value_or(0);
    for (std::size_t s = first; s < o_.steps; ++s) {
      set_phase("training step " + std::to_string(s + 1));
      if (fault_ && fault_->save_point.empty() && fault_->step == s + 1 && fault_->rank == rank())
        inject(*fault_);
#if defined(HSPMD_HAS_MPI)
      if (monitor_)
        (void)dist_->take_compute_seconds(); // this step's compute only (not an evaluation's)
#endif
      e.barrier();
      const auto start = clock::now();
      auto fed = start;
      const double lr = o_.lr.at(s, o_.steps);
      opt_.lr = lr;
      if (loss_scale)
        e.set_loss_scale(loss_scale->scale());
      double loss = 0.0;
      for (std::size_t m = 0; m < o_.accumulate; ++m) {
        e.set_step(s * o_.accumulate + m); // before the feed: input checks name the step
        const auto f0 = clock::now();
        feed(e, s * o_.accumulate + m);
        fed += clock::now() - f0;
        loss += e.forward();
        e.backward();
        if (o_.accumulate > 1)
          e.accumulate(m, o_.accumulate);
      }
      loss /= static_cast<double>(o_.accumulate);
      // Clipping is fused into the optimizer's pass: the norm's one reduction, then the factor
      // (with f16's loss scale divided out).
      const double unscale = loss_scale ? 1.0 / loss_scale->scale() : 1.0;
      const double norm = e.grad_norm() * unscale;
      const bool apply = !loss_scale || loss_scale->update(!std::isfinite(norm));
      if (apply)
        e.step(opt_, clip_scale(norm, o_.clip) * unscale);
      else
        ++r.skipped_steps;
      const auto done = clock::now();
      e.step_span(s, start, fed, done, loss);
      const double seconds = e.slowest(std::chrono::duration<double>(done - start).count());
      elapsed += seconds;
      r.losses.push_back(loss);
      r.step_seconds.push_back(seconds);
      const step_report rep{s, loss, lr, norm, seconds};
      if (metrics.is_open()) {
        nlohmann::json j{
            {"step", s + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm}, {"seconds", seconds}};
        if (seconds > 0.0) {
          j["model_flops_per_s"] = model_flops_per_step() / seconds;
          if (const double u = mfu(seconds); u > 0.0)
            j["mfu"] = u;
        }
        if (loss_scale) {
          j["loss_scale"] = loss_scale->scale();
          if (!apply)
            j["skipped"] = true;
        }
        if (const auto m = e.memory()) { // a device's allocator: flat after the second step
          j["allocated_bytes"] = m->allocated_bytes;
          j["reserved_bytes"] = m->reserved_bytes;
        }
        metrics << j.dump() << "\n" << std::flush; // a crashed run keeps its lines
      }
      if (out != nullptr && ((s + 1) % every == 0 || s + 1 == o_.steps))
        progress(*out, rep, elapsed);
      if (on_step_ != nullptr && *on_step_)
        (*on_step_)(rep);
#if defined(HSPMD_HAS_MPI)
      if (monitor_ && s + 1 < o_.steps)
        maybe_rebalance(s, r, metrics);
#endif
      if (o_.save_every > 0 && ((s + 1) % o_.save_every == 0 || s + 1 == o_.steps))
        save(e, s + 1, r, loss_scale, out);
      if (eval && ((o_.eval_every > 0 && (s + 1) % o_.eval_every == 0) || s + 1 == o_.steps)) {
        r.evals.push_back(run_eval(eval, o_.eval_batches, s + 1));
        if (metrics.is_open()) {
          const auto& ev = r.evals.back();
          nlohmann::json j{{"eval_after_step", s + 1}, {"loss", ev.loss}};
          if (!std::isnan(ev.accuracy))
            j["accuracy"] = ev.accuracy;
          if (!std::isnan(ev.perplexity))
            j["perplexity"] = ev.perplexity;
          metrics << j.dump() << "\n" << std::flush; // a crashed run keeps its lines
        }
      }
    }
#if defined(HSPMD_HAS_MPI)
    if (dist != nullptr && !o_.trace.empty())
      write_trace(*dist);
#endif
    if (loss_scale)
      r.loss_scale = loss_scale->scale();
    if (out != nullptr && !r.losses.empty()) {
      summary(*out, r);
      if (const auto m = e.memory())
        print(*out,
              "device memory: peak %.1f MiB allocated, %.1f MiB reserved (%zu device "
              "allocations, %zu from the cache)\n",
              static_cast<double>(m->peak_allocated_bytes) / 1048576.0,
              static_cast<double>(m->peak_reserved_bytes) / 1048576.0, m->device_allocations,
              m->cache_hits);
    }
    if (out != nullptr && o_.profile)
      write_profile(*out, std::span<const profile_entry>(e.profile()),
                    r.losses.size() * o_.accumulate);
    return r;
  }

  // What a checkpoint's manifest says of the run besides its tensors (docs/checkpoint.md).
  nlohmann::json checkpoint_meta(std::size_t step,
                                 const std::optional<dynamic_loss_scale>& loss_scale) const {
    nlohmann::json m;
    m["model"] = {{"name", o_.name}, {"hash", to_hex(synth::graph_hash(g_))}};
    if (plan_)
      m["plan"] = {{"strategy", plan_->strategy},
                   {"ratios", plan_->ratios},
                   {"cluster_fingerprint", to_hex(plan_->cluster_fingerprint)}};
    m["ranks"] = plan_ && !plan_->ratios.empty() ? plan_->ratios.front().size() : std::size_t{1};
    m["optimizer"] = {{"kind", std::string(Optimizer::kind)},
                      {"lr", o_.lr.peak},
                      {"weight_decay", o_.weight_decay},
                      {"clip", o_.clip}};
    if constexpr (requires { opt_.steps(); })
      m["optimizer"]["steps"] = opt_.steps();
    if constexpr (requires { opt_.beta1; })
      m["optimizer"].update({{"beta1", opt_.beta1}, {"beta2", opt_.beta2}, {"eps", opt_.eps}});
    m["schedule"] = {{"shape", o_.lr.shape == lr_schedule::kind::constant ? "constant" : "cosine"},
                     {"peak", o_.lr.peak},
                     {"warmup", o_.lr.warmup},
                     {"floor", o_.lr.floor},
                     {"steps", o_.steps},
                     {"next_step", step}};
    m["data"] = {{"next_micro_batch", step * o_.accumulate},
                 {"batch", o_.batch},
                 {"accumulate", o_.accumulate}};
    m["rng"] = {{"seed", o_.seed},
                {"kind", "counter-based: initial values by seed, dropout by seed and micro-batch "
                         "index; nothing else to restore"}};
    m["precision"] = std::string(name(o_.precision));
    m["recompute"] = o_.recompute;
    if (loss_scale) {
      const auto ls = loss_scale->save();
      m["loss_scale"] = {{"scale", ls.scale}, {"clean_steps", ls.clean}, {"skipped", ls.skipped}};
    }
    return m;
  }

  void save(engine<T, Optimizer>& e, std::size_t step, train_result& r,
            const std::optional<dynamic_loss_scale>& loss_scale, std::ostream* out) {
    set_phase("saving the checkpoint after step " + std::to_string(step));
    const auto t0 = std::chrono::steady_clock::now();
    checkpoint_options co;
    co.keep = o_.keep_checkpoints;
    if (fault_ && !fault_->save_point.empty() && fault_->step == step && fault_->rank == rank())
      co.at_point = [f = *fault_](std::string_view point) {
        if (point == f.save_point)
          inject_fault(f);
      };
    const auto dir =
        e.save_state(o_.checkpoint_dir, step, checkpoint_meta(step, loss_scale), opt_, co);
    const double seconds =
        e.slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    r.checkpoints.push_back(dir.string());
    if (out != nullptr)
      print(*out, "checkpoint after step %zu: %s (%.0f ms)\n", step, dir.string().c_str(),
            1e3 * seconds);
  }

  // The parameters of the checkpoint init_from names (any layout, or an import): the optimizer,
  // the schedule and the data start fresh.
  void initialize_from(engine<T, Optimizer>& e, train_result& r, std::ostream* out) {
    set_phase("initializing from " + o_.init_from);
    const auto t0 = std::chrono::steady_clock::now();
    const checkpoint_info info = e.load_state(o_.init_from, opt_, true);
    r.initialized_from = info.dir.string();
    const double seconds =
        e.slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (out != nullptr)
      print(*out, "parameters from %s (step %zu%s; loaded in %.0f ms)\n", info.dir.string().c_str(),
            info.step, info.meta.contains("imported") ? ", imported" : "", 1e3 * seconds);
  }

  // Loads the newest checkpoint of checkpoint_dir, if any; returns the step to continue from,
  // nothing when there is none.
  std::optional<std::size_t> resume(engine<T, Optimizer>& e, train_result& r,
                                    std::optional<dynamic_loss_scale>& loss_scale,
                                    std::ostream* out) {
    set_phase("resuming from " + o_.checkpoint_dir);
    bool any = find_checkpoint(o_.checkpoint_dir).has_value();
#if defined(HSPMD_HAS_MPI)
    if (distributed()) { // rank 0's view decides (the load agrees on the directory again)
      std::string v = any ? "1" : "";
      broadcast_text(*comm_, v);
      any = !v.empty();
    }
#endif
    if (!any) {
      if (out != nullptr)
        print(*out, "resume: no checkpoint in %s yet; starting from step 0\n",
              o_.checkpoint_dir.c_str());
      return std::nullopt;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const checkpoint_info info = e.load_state(o_.checkpoint_dir, opt_, false);
    const auto& m = info.meta;
    const std::string file = (info.dir / "manifest.json").string();
    const std::string hash = to_hex(synth::graph_hash(g_));
    if (m.contains("model") && m["model"].value("hash", hash) != hash)
      throw config_error(file,
                         "was saved from another model (graph hash " +
                             m["model"].value("hash", std::string("?")) + ", this one " + hash +
                             ")",
                         "resume with the model and batch the checkpoint was saved with");
    if (m.contains("optimizer") &&
        m["optimizer"].value("kind", std::string(Optimizer::kind)) != Optimizer::kind)
      throw config_error(file,
                         "holds the state of optimizer " +
                             m["optimizer"].value("kind", std::string()) + ", this run uses " +
                             std::string(Optimizer::kind),
                         "resume with the optimizer the checkpoint was saved with");
    if constexpr (requires { opt_.set_steps(std::size_t{}); })
      if (m.contains("optimizer") && m["optimizer"].contains("steps"))
        opt_.set_steps(m["optimizer"]["steps"].template get<std::size_t>());
    if (loss_scale && m.contains("loss_scale"))
      loss_scale->restore({m["loss_scale"].value("scale", 1.0),
                           m["loss_scale"].value("clean_steps", std::size_t{0}),
                           m["loss_scale"].value("skipped", std::size_t{0})});
    r.resumed_from = info.step;
    const double seconds =
        e.slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (out != nullptr)
      print(*out, "resumed from %s: step %zu of %zu (loaded in %.0f ms)\n",
            info.dir.string().c_str(), info.step, o_.steps, 1e3 * seconds);
    return std::min(info.step, o_.steps);
  }

  eval_report run_eval(const feed_fn<T>& eval, std::size_t batches, std::size_t after_step) {
    set_phase("evaluation after step " + std::to_string(after_step));
    engine<T, Optimizer>& e = *engine_;
    e.set_training(false);
    eval_report rep;
    rep.after_step = after_step;
    const auto loss_id = *g_.loss();
    const graph::node& loss_node = g_[loss_id];
    const bool classify = loss_node.kind == graph::op::cross_entropy;
    // Accuracy compares the logits' arg-max with the targets as fed (through reshapes).
    std::optional<graph::node_id> targets;
    if (classify) {
      graph::node_id t = loss_node.inputs[1];
      while (g_[t].kind == graph::op::reshape)
        t = g_[t].inputs[0];
      if (g_[t].kind == graph::op::input)
        targets = t;
    }
    struct capture final : batch_sink<T> {
      batch_sink<T>* inner;
      std::string name;
      std::vector<std::int64_t> ids;
      void set_input(std::string_view n, std::span<const T> v) override { inner->set_input(n, v); }
      void set_input(std::string_view n, std::span<const std::int64_t> v) override {
        if (n == name)
          ids.assign(v.begin(), v.end());
        inner->set_input(n, v);
      }
      using batch_sink<T>::set_input;
    } sink;
    sink.inner = &e;
    sink.name = targets ? g_[*targets].name : std::string();
    double loss = 0.0;
    std::size_t right = 0;
    std::size_t rows = 0;
    for (std::size_t b = 0; b < batches; ++b) {
      e.set_step(0);
      eval(sink, b);
      loss += e.forward();
      if (classify && targets && o_.metric == eval_metric::accuracy) {
        const auto logits = e.whole(loss_node.inputs[0]);
        const std::size_t v = g_[loss_node.inputs[0]].out.dims[1];
        for (std::size_t i = 0; i < sink.ids.size() && (i + 1) * v <= logits.size(); ++i) {
          const auto row = std::span<const T>(logits).subspan(i * v, v);
          const auto best = static_cast<std::int64_t>(std::ranges::max_element(row) - row.begin());
          right += best == sink.ids[i] ? 1U : 0U;
          ++rows;
        }
      }
    }
    e.set_training(true);
    rep.loss = loss / static_cast<double>(batches);
    if (classify && o_.metric == eval_metric::perplexity) {
      const double per_row =
          loss_node.attrs.scalar > 0.0
              ? rep.loss
              : rep.loss / static_cast<double>(g_[loss_node.inputs[0]].out.dims[0]);
      rep.perplexity = std::exp(per_row);
    }
    if (rows > 0)
      rep.accuracy = static_cast<double>(right) / static_cast<double>(rows);
    if (e.root() && o_.out != nullptr) {
      print(*o_.out, "eval after step %zu: loss %.4f", after_step, rep.loss);
      if (!std::isnan(rep.accuracy))
        print(*o_.out, ", accuracy %.2f%%", 100.0 * rep.accuracy);
      if (!std::isnan(rep.perplexity))
        print(*o_.out, ", perplexity %.2f", rep.perplexity);
      print(*o_.out, " (%zu micro-batch%s)\n", batches, batches == 1 ? "" : "es");
    }
    if (on_eval_ != nullptr && *on_eval_)
      (*on_eval_)(rep);
    return rep;
  }

  void progress(std::ostream& out, const step_report& r, double elapsed) const {
    constexpr std::size_t width = 20;
    const std::size_t done = r.step + 1;
    std::string bar(width * done / o_.steps, '#');
    bar.resize(width, '.');
    const double per_step = elapsed / static_cast<double>(done);
    const double units = static_cast<double>(o_.batch * o_.accumulate * o_.units_per_sample);
    const double mfu = this->mfu(per_step);
    print(out, "%s step %5zu/%-5zu [%s] loss %9.4f  lr %.2e  %8.2f ms/step  %9.1f %s/s%s  ETA %s\n",
          o_.name.c_str(), done, o_.steps, bar.c_str(), r.loss, r.lr, 1e3 * per_step,
          units / per_step, o_.unit.c_str(), mfu > 0.0 ? percent_text("  MFU", mfu).c_str() : "",
          duration_text(per_step * static_cast<double>(o_.steps - done)).c_str());
    out.flush();
  }

  // The model's FLOPs of one optimizer step (forward and backward of every micro-batch;
  // recomputation and replicated work not counted).
  [[nodiscard]] double model_flops_per_step() const {
    const auto cost = graph::total_cost(g_);
    return (cost.forward_flops + cost.backward_flops) * static_cast<double>(o_.accumulate);
  }
  // Model FLOPs utilisation of a step of `seconds`: model FLOP/s over the devices' summed peak;
  // 0 when a peak is unknown.
  [[nodiscard]] double mfu(double seconds) const {
    double peak = 0.0;
    for (double p : peaks_) {
      if (p <= 0.0)
        return 0.0;
      peak += p;
    }
    return seconds > 0.0 && peak > 0.0 ? model_flops_per_step() / seconds / peak : 0.0;
  }
  static std::string percent_text(const char* label, double fraction) {
    char b[48];
    std::snprintf(b, sizeof b, "%s %.1f%%", label, 100.0 * fraction);
    return b;
  }

  void summary(std::ostream& out, const train_result& r) const {
    const double median = r.median_step_seconds();
    print(out, "%s: loss %.4f -> %.4f over %zu steps; step time measured %.2f ms (median)",
          o_.name.c_str(), r.losses.front(), r.losses.back(), r.losses.size(), 1e3 * median);
    if (plan_)
      print(out, ", predicted %s (%+.0f%%)",
            synth::milliseconds_text(r.predicted_step_seconds).c_str(),
            100.0 * (r.predicted_step_seconds - median) / median);
    if (plan_ && r.simulated_step_seconds > 0.0)
      print(out, ", simulated %s (%+.0f%%)",
            synth::milliseconds_text(r.simulated_step_seconds).c_str(),
            100.0 * (r.simulated_step_seconds - median) / median);
    out << "\n";
    if (median > 0.0) {
      print(out, "model %.2f GFLOP/s", model_flops_per_step() / median / 1e9);
      if (const double u = mfu(median); u > 0.0) {
        double peak = 0.0;
        for (double p : peaks_)
          peak += p;
        print(out, ", MFU %.1f%% of %.1f GFLOP/s peak", 100.0 * u, peak / 1e9);
        if (peaks_.size() > 1) { // what each device ran of its own program, over its peak
          out << " (each device's own FLOPs over its peak:";
          const double per_mb = static_cast<double>(o_.accumulate) / median;
          for (std::size_t d = 0; d < peaks_.size() && d < 16; ++d)
            print(out, " %s %.1f%%", device_names_[d].c_str(),
                  100.0 * rank_flops_[d] * per_mb / peaks_[d]);
          out << (peaks_.size() > 16 ? " ...)" : ")");
        }
      } else if (!peaks_.empty())
        out << (distributed() ? " (MFU: a device's peak is unknown; give it in the cluster "
                                "file's \"peak\")"
                              : " (MFU: measured against the host BLAS only; no peak is known "
                                "for this device)");
      out << "\n";
    }
    if (!r.rebalances.empty() && plan_)
      print(out, "re-balanced %zu time%s; the plan now predicts %s per step\n", r.rebalances.size(),
            r.rebalances.size() == 1 ? "" : "s",
            synth::milliseconds_text(plan_->step_time).c_str());
    if (o_.precision == exec::precision::f16)
      print(out, "f16: %zu of %zu steps skipped (gradients overflowed); loss scale now %g\n",
            r.skipped_steps, r.losses.size(), r.loss_scale);
    out.flush();
  }

  // "run.json" -> "run.simulated.json"
  static std::string simulated_trace_path(const std::string& trace) {
    const auto slash = trace.find_last_of('/');
    const auto dot = trace.find_last_of('.');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
      return trace + ".simulated";
    return trace.substr(0, dot) + ".simulated" + trace.substr(dot);
  }

#if defined(HSPMD_HAS_MPI)
  void write_trace(rank_engine<T, Optimizer>& d) {
    std::vector<std::string> devices;
    for (const auto& dev : cluster_.devices)
      devices.push_back(dev.name + (dev.slowdown > 1.0
                                        ? ", emulated " + times_text(dev.slowdown) + " slower"
                                        : ""));
    const auto t = d.collect_trace(devices);
    if (d.root()) {
      write_file(o_.trace, t.dump());
      if (o_.out != nullptr)
        print(*o_.out, "trace: %zu events of %zu ranks in %s (open in ui.perfetto.dev)\n",
              t["traceEvents"].size(), cluster_.size(), o_.trace.c_str());
      if (plan_) { // the simulated step next to it (sim/step.hpp), priced as the prediction
        sim::options so;
        so.element_bytes = sizeof(T);
        if (o_.bucket_mb > 0.0)
          so.bucket_bytes = o_.bucket_mb * 1024.0 * 1024.0;
        for (std::size_t k = 0; k < cluster_.size(); ++k)
          so.traced.push_back(k);
        so.measured = shard_times_ ? &*shard_times_ : nullptr;
        const sim::result r = sim::simulate(*plan_, cost_model_for(cluster_), so);
        const std::string path = simulated_trace_path(o_.trace);
        write_file(path, sim::trace_of(r, so, cluster_,
                                       {{"simulated", true}, {"step_seconds", r.step_time}})
                             .dump());
        if (o_.out != nullptr)
          print(*o_.out, "simulated step (%s) in %s\n",
                synth::milliseconds_text(r.step_time).c_str(), path.c_str());
      }
    }
  }
#endif

  graph::graph g_;
  train_options o_;
  Optimizer opt_{1e-3};
  // MFU: per rank (one entry in one process) its peak flop/s (0: unknown), the FLOPs its own
  // program runs per micro-batch, and its name.
  std::vector<double> peaks_;
  std::vector<double> rank_flops_;
  std::vector<std::string> device_names_;
  std::optional<synth::plan> plan_;
#if defined(HSPMD_HAS_MPI)
  std::unique_ptr<mpi_communicator> comm_;
  cluster cluster_;
  synth::synth_options so_; // how the plan was made (re-balancing re-prices)

  // The tensor-parallel baseline of the model on two devices like rank 0 (for the weight-fixed
  // shares, train/profile.hpp); none where that baseline finds no plan.
  [[nodiscard]] std::optional<synth::plan> weight_splitting_plan() const {
    cluster two = cluster_;
    two.devices = {cluster_.devices.at(0), cluster_.devices.at(0)};
    two.devices[1].name += "'";
    two.inter_node.reset();
    two.devices[1].node = two.devices[0].node;
    two.collective_costs.clear();
    synth::synth_options opt;
    opt.segments = so_.segments;
    opt.search.check_memory = false; // measured on the host, one piece at a time
    opt.search.max_seconds = 1.0;
    try {
      return synth::make_baseline(g_, two, synth::baseline::tp, opt);
    } catch (const plan_error&) {
      return std::nullopt;
    }
  }
  std::optional<profile_options> calibration_;  // how --calibrate measured (when it did)
  std::optional<sim::shard_times> shard_times_; // the plan's ops at every rank's pieces
  std::optional<straggler_monitor> monitor_;    // with train_options::rebalance
  lp::basis basis_;                             // rank 0: the ratio LP's last basis
#endif
  std::unique_ptr<engine<T, Optimizer>> engine_;
  rank_engine<T, Optimizer>* dist_ = nullptr; // engine_, in a distributed run
  std::optional<fault_spec> fault_;           // HSPMD_FAULT
  const std::function<void(const step_report&)>* on_step_ = nullptr;
  const std::function<void(const eval_report&)>* on_eval_ = nullptr;
};

} // namespace detail

template <std::floating_point T, class Optimizer>
trainer<T, Optimizer>::trainer(const model_fn& model, const train_options& o)
    : s_(std::make_unique<detail::trainer_state<T, Optimizer>>(model, o)) {
  s_->callbacks(&on_step, &on_eval);
}
template <std::floating_point T, class Optimizer>
trainer<T, Optimizer>::trainer(graph::graph g, train_options o)
    : s_(std::make_unique<detail::trainer_state<T, Optimizer>>(std::move(g), std::move(o))) {
  s_->callbacks(&on_step, &on_eval);
}
template <std::floating_point T, class Optimizer>
trainer<T, Optimizer>::~trainer() = default;

template <std::floating_point T, class Optimizer>
train_result trainer<T, Optimizer>::fit(const feed_fn<T>& feed, const feed_fn<T>& eval) {
  return s_->fit(feed, eval);
}
template <std::floating_point T, class Optimizer>
eval_report trainer<T, Optimizer>::evaluate(const feed_fn<T>& eval, std::size_t batches,
                                            std::size_t after_step) {
  return s_->evaluate(eval, batches, after_step);
}
template <std::floating_point T, class Optimizer>
const graph::graph& trainer<T, Optimizer>::graph() const {
  return s_->graph();
}
template <std::floating_point T, class Optimizer>
const train_options& trainer<T, Optimizer>::options() const {
  return s_->options();
}
template <std::floating_point T, class Optimizer>
const synth::plan* trainer<T, Optimizer>::plan() const {
  return s_->plan() ? &*s_->plan() : nullptr;
}
template <std::floating_point T, class Optimizer>
executor<T, host_backend>& trainer<T, Optimizer>::local() {
  return s_->local();
}
template <std::floating_point T, class Optimizer>
std::vector<T> trainer<T, Optimizer>::value(std::string_view name) {
  return s_->value(name);
}
template <std::floating_point T, class Optimizer>
std::string trainer<T, Optimizer>::device() const {
  return s_->device();
}
template <std::floating_point T, class Optimizer>
Optimizer& trainer<T, Optimizer>::optimizer() {
  return s_->optimizer();
}
template <std::floating_point T, class Optimizer>
bool trainer<T, Optimizer>::root() const {
  return s_->root();
}

} // namespace hspmd::train
