#pragma once
// The library trainer's loop (train/trainer.hpp has the declarations and the manual): a small
// class over an engine (one process's executor, or one rank's) and a world (the ranks it spans,
// train/world.hpp). Everything else is a plain function it calls: starting the ranks and
// planning (train/start.hpp, train/run_plan.hpp), checking the options (train/option_table.hpp),
// checkpoint metadata (train/run_meta.hpp), re-balancing (train/run_plan.hpp) and the lines it
// prints (train/report.hpp). One process and a distributed rank differ through the engine and
// the world, not here. Included by train/trainer.hpp unless HSPMD_COMPILED is defined;
// hspmd::compiled's src/trainer.cpp instantiates it once.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/tracer.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/evaluate.hpp>
#include <hspmd/train/fault.hpp>
#include <hspmd/train/loss_scale.hpp>
#include <hspmd/train/metrics_log.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/option_checks.hpp>
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/report.hpp>
#include <hspmd/train/report_svg.hpp>
#include <hspmd/train/run_checkpoints.hpp>
#include <hspmd/train/run_dir.hpp>
#include <hspmd/train/run_meta.hpp>
#include <hspmd/train/run_plan.hpp>
#include <hspmd/train/start.hpp>
#include <hspmd/train/trainer.hpp>
#include <hspmd/train/world.hpp>

#include <nlohmann/json.hpp>

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
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace hspmd::train {

namespace detail {

/// Everything a trainer holds and does (train/trainer.hpp declares the public face).
template <std::floating_point T, class Optimizer>
class trainer_state {
public:
  trainer_state(const model_fn& model, const train_options& o)
      : trainer_state(trace(model, o), with_trace_at(model, o)) {}
  trainer_state(graph::graph g, train_options o) : g_(std::move(g)), o_(std::move(o)) {
    check_model_sizes(g_, o_.name);
    for (const graph::node& n : g_.nodes())
      if (n.kind == graph::op::input && n.out.batch_dim) {
        o_.batch = n.out.dims[*n.out.batch_dim];
        break;
      }
    opt_ = make_optimizer();
    if (distributed() && o_.device != "host" && o_.device != "auto") { // before MPI starts
      const auto* e = find_device_engine<T, Optimizer>(o_.device);
      if (e == nullptr)
        (void)make_engine<T, Optimizer>(
            g_, o_.device, o_.seed); // the single process's error for an unknown device
      else if (!e->make_distributed)
        throw config_error("device " + o_.device, "trains one process only",
                           "give device host (or auto) with a cluster, or drop the cluster");
    }
    if (!distributed())
      start_single();
    else
      start_ranks();
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
  [[nodiscard]] const synth::plan* plan() const noexcept { return run_ ? &run_->plan : nullptr; }
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
    trainer_types types;
    types.float_model = std::is_same_v<T, float>;
    types.optimizer_state = requires(Optimizer & x) {
      x.state();
    };
    types.optimizer = typeid(Optimizer).name();
    check_run_options(o_, distributed(), fault_, types);
  }

  void start_single() {
    check_options();
    if (o_.save_graph.size() > 0)
      write_file(o_.save_graph, graph::to_json(g_).dump(1));
    engine_ = make_engine<T, Optimizer>(g_, o_.device, o_.seed);
    engine_->set_profiling(o_.profile);
    engine_->set_precision(o_.precision);
    enable_recompute(*engine_, g_, o_, true);
    meter_ = flops_meter(g_, o_.accumulate);
    meter_.rank_flops = {meter_.model_flops_per_step / static_cast<double>(o_.accumulate)};
    meter_.device_names = {engine_->device()};
    meter_.peaks = {0.0};
    const bool host = engine_->device() == "host";
    if (host) // the float GEMM's measured rate: what MFU is reported against
      meter_.peaks[0] = blas::status().sgemm_flops;
    if (o_.out != nullptr) {
      describe(*o_.out, g_, o_, engine_->device());
      if (host)
        say_blas(*o_.out, blas::status());
      if (o_.print_graph)
        graph::print(*o_.out, g_);
    }
  }

  // This rank of a distributed run (train/start.hpp): its world, plan, engine and MFU facts.
  void start_ranks() {
    distributed_run<T, Optimizer> d =
        start_distributed<T, Optimizer>(g_, o_, [this] { check_options(); });
    world_ = std::move(d.ranks);
    if (d.pipeline) { // a pipeline run: no one-level plan, rank engine or re-balancing
      engine_ = std::move(d.pipeline);
      meter_ = std::move(d.meter);
      return;
    }
    run_ = std::move(d.run);
    meter_ = std::move(d.meter);
    rebalancing_ = std::move(d.rebalance);
    dist_ = d.engine.get();
    engine_ = std::move(d.engine);
  }

  // `body()` where a failure on any rank ends every rank with one line (train/world.hpp).
  template <class F>
  auto guarded(F&& body) {
    using R = decltype(body());
    std::optional<R> r;
    world_->guarded([&] { r.emplace(body()); });
    return std::move(*r);
  }

  // HSPMD_FAULT's fault on this rank (train/fault.hpp); only `slow` returns.
  void inject(const fault_spec& f) {
    inject_fault(f);
    if (dist_ != nullptr)
      dist_->set_slowdown(run_->c.devices.at(static_cast<std::size_t>(world_->rank())).slowdown *
                          f.factor);
  }

  // The loop (see the file comment); every rank runs it in step.
  train_result run(const feed_fn<T>& feed, const feed_fn<T>& eval) {
    using clock = std::chrono::steady_clock;
    engine<T, Optimizer>& e = *engine_;
    const bool is_root = e.root();
    std::ostream* out = is_root ? o_.out : nullptr;
    metrics_log metrics; // rank 0's (train/metrics_log.hpp)
    if (is_root)
      metrics.open(o_.metrics, o_.resume);
    if (is_root && !o_.report.empty())
      make_report_dir(o_.report); // (train/report_svg.hpp) before step 1, not after the last
    if (world_ && !o_.trace.empty())
      e.start_trace();
    train_result r;
    if (run_) {
      r.predicted_step_seconds = run_->plan.step_time;
      r.simulated_step_seconds = run_->simulated_step(g_);
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
      resumed = resume_run(state(e, out), r, loss_scale ? &*loss_scale : nullptr);
    if (!resumed && !o_.init_from.empty())
      initialize_run(state(e, out), r);
    const std::size_t first = resumed.value_or(0);
    std::optional<ram_options> ram; // --ram-dir (train/ram_tier.hpp)
    if (!o_.ram_dir.empty()) {
      if (!e.keeps_ram_tier())
        throw config_error("--ram-dir on device " + e.device(),
                           "the RAM tier keeps host tensors only, for now",
                           "train on the host (--device host), or drop --ram-dir");
      ram = ram_setup(o_, *world_, run_ ? &run_->c : nullptr, r.ram_resumed);
      e.ram_start(opt_, *ram);
    }
    ram_cadence cadence(o_.ram_budget, o_.ram_every, o_.steps, first); // --ram-budget
    auto top = clock::now();
    const auto launcher_dir = run_directory(); // hspmd-run's (train/run_dir.hpp)
    metrics.start(world_ ? static_cast<std::size_t>(world_->size()) : 1, o_.steps, resumed,
                  1e3 * r.load_seconds, run_ ? 1e3 * run_->plan_seconds : 0.0);
    for (std::size_t s = first; s < o_.steps; ++s) {
      if (ram && s > first &&
          cadence.measure(s, std::chrono::duration<double>(clock::now() - top).count()))
        decide_ram_cadence(cadence, *world_, out, metrics, o_.ram_budget);
      top = clock::now();
      world_->set_phase("training step " + std::to_string(s + 1));
      const bool node_lost = fault_ && fault_->what == fault_spec::kind::node;
      if (fault_ && fault_->save_point.empty() && fault_->step == s + 1 && !node_lost &&
          fault_->rank == world_->rank())
        inject(*fault_);
      if (rebalancing_)
        (void)dist_->take_compute_seconds(); // this step's compute only (not an evaluation's)
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
      e.ram_poll(); // the RAM tier: the last save copied before the update changes the state
      if (node_lost && fault_->step == s + 1 &&
          node_fault_strikes(*fault_, *world_, run_ ? &run_->c : nullptr, ram))
        inject(*fault_); // a machine lost in the middle of a step
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
      metrics.write(step_metrics(
          rep, meter_, loss_scale ? std::optional<double>(loss_scale->scale()) : std::nullopt,
          apply, e.memory()));
      if (out != nullptr && ((s + 1) % every == 0 || s + 1 == o_.steps))
        progress(*out, o_, meter_, rep, elapsed, first);
      if (on_step_ != nullptr && *on_step_)
        (*on_step_)(rep);
      if (rebalancing_ && s + 1 < o_.steps)
        if (auto rb = rebalance_after_step(g_, *run_, *rebalancing_, *world_, s,
                                           dist_->take_compute_seconds(), rebalance_moves(), out,
                                           metrics))
          r.rebalances.push_back(std::move(*rb));
      if (ram && cadence.save_after(s + 1))
        r.ram_save_seconds +=
            save_run_ram(state(e, out), s + 1, loss_scale ? &*loss_scale : nullptr, *ram);
      const bool saved = o_.save_every > 0 && ((s + 1) % o_.save_every == 0 || s + 1 == o_.steps);
      if (saved)
        save_run_checkpoint(state(e, out), s + 1, r, loss_scale ? &*loss_scale : nullptr, fault_);
      if (launcher_dir && s + 1 < o_.steps && stop_requested(*world_, *launcher_dir)) {
        // hspmd-run changes the devices: this step saved, the job resumes from it on the new.
        if (!saved && !o_.checkpoint_dir.empty())
          save_run_checkpoint(state(e, out), s + 1, r, loss_scale ? &*loss_scale : nullptr, fault_);
        if (out != nullptr)
          print(*out,
                "stopped after step %zu: hspmd-run changes the devices; the run resumes "
                "from this step\n",
                s + 1);
        metrics.write({{"event", "stopped"}, {"after_step", s + 1}});
        r.stopped_after = s + 1;
        break;
      }
      if (eval && ((o_.eval_every > 0 && (s + 1) % o_.eval_every == 0) || s + 1 == o_.steps)) {
        r.evals.push_back(run_eval(eval, o_.eval_batches, s + 1));
        metrics.write(eval_metrics(r.evals.back()));
      }
    }
    if (world_ && !o_.trace.empty()) { // (a pipeline's engine names its devices)
      const auto t =
          e.collect_trace(run_ ? trace_device_names(run_->c) : std::vector<std::string>{});
      if (e.root())
        write_traces(t, g_, o_, static_cast<std::size_t>(world_->size()), run_ ? &*run_ : nullptr);
    }
    if (ram) {
      r.ram = e.ram_finish();
      say_ram(out, metrics, r);
    }
    if (loss_scale)
      r.loss_scale = loss_scale->scale();
    if (out != nullptr && !r.losses.empty())
      summary(*out, o_, r, plan(), meter_, distributed(), e.memory());
    if (is_root && !o_.report.empty()) {
      const auto files = write_run_report(o_.report, o_.name, r);
      if (out != nullptr)
        print(*out, "report: %s, %s, %s\n", files[0].c_str(), files[1].c_str(), files[2].c_str());
    }
    if (out != nullptr && o_.profile)
      write_profile(*out, std::span<const profile_entry>(e.profile()),
                    r.losses.size() * o_.accumulate);
    return r;
  }

  // What re-balancing does to this rank's engine: moves its state (timed, the slowest rank's
  // seconds) and marks the trace.
  [[nodiscard]] rebalance_hooks rebalance_moves() {
    rebalance_hooks h;
    h.move = [this](const synth::plan& next) {
      const auto m0 = std::chrono::steady_clock::now();
      dist_->rebalance(next, opt_);
      return dist_->slowest(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - m0).count());
    };
    h.trace = [this](const std::string& name, std::chrono::steady_clock::time_point begin,
                     std::chrono::steady_clock::time_point end,
                     const nlohmann::json& args) { dist_->trace_event(name, begin, end, args); };
    return h;
  }

  [[nodiscard]] run_context<T, Optimizer> state(engine<T, Optimizer>& e, std::ostream* out) {
    if (!graph_hash_)
      graph_hash_ = synth::graph_hash(g_); // once: the graph does not change
    return {e, *world_, o_, opt_, g_, *graph_hash_, plan(), out};
  }

  eval_report run_eval(const feed_fn<T>& eval, std::size_t batches, std::size_t after_step) {
    world_->set_phase("evaluation after step " + std::to_string(after_step));
    const eval_report rep = train::evaluate(*engine_, g_, o_.metric, eval, batches, after_step);
    if (engine_->root() && o_.out != nullptr)
      say_eval(*o_.out, rep, batches);
    if (on_eval_ != nullptr && *on_eval_)
      (*on_eval_)(rep);
    return rep;
  }

  graph::graph g_;
  std::optional<std::uint64_t> graph_hash_; // of g_, for checkpoints' metadata
  train_options o_;
  Optimizer opt_{1e-3};
  std::unique_ptr<world> world_ = std::make_unique<world>(); // one process until started
  std::optional<planned_run> run_;                           // a distributed run's plan
  flops_meter meter_;                                        // model FLOP/s and MFU
  std::optional<rebalancing> rebalancing_;                   // with train_options::rebalance
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
  return s_->plan();
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
