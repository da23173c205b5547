#pragma once
// Shared driver of the example models: common flags, synthetic data generators, and a training
// run, single process or, with --cluster, on every rank of an MPI job with a synthesized or
// baseline plan, with a summary of what was measured.

#include <hspmd/hspmd.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace example {

/// Flags every example takes.
struct common_options {
  std::size_t steps = 20;
  std::size_t batch = 8;
  std::uint64_t seed = 1;
  double lr = 1e-3;
  double clip = 1.0;
  std::vector<std::string> data; ///< text file (LM) or CIFAR-10 .bin files (images)
  bool print_graph = false;
  bool profile = false;
  std::string cluster;        ///< distributed run over MPI on this cluster (one rank per device)
  std::string plan = "synth"; ///< synth, dp-ev, dp-cp or tp
  bool explain = false;
  bool calibrate = false; ///< measure compute and collectives before planning
  std::string trace;      ///< Chrome/Perfetto trace file of the distributed run
};

/// Where a step's whole batch goes: the single-process executor, or every rank's distributed
/// executor (each keeps its piece).
class input_sink {
public:
  virtual ~input_sink() = default;
  virtual void set_input(std::string_view name, std::span<const float> v) = 0;
  virtual void set_input(std::string_view name, std::span<const std::int64_t> v) = 0;
};
/// Feeds step `step`'s batch.
using feed_fn = std::function<void(input_sink&, std::size_t)>;

template <class Executor>
class sink_of final : public input_sink {
public:
  explicit sink_of(Executor& ex) : ex_(&ex) {}
  void set_input(std::string_view name, std::span<const float> v) override {
    ex_->set_input(name, v);
  }
  void set_input(std::string_view name, std::span<const std::int64_t> v) override {
    ex_->set_input(name, v);
  }

private:
  Executor* ex_;
};

inline void add_common(CLI::App& app, common_options& o) {
  app.add_option("--steps", o.steps, "training steps")->capture_default_str();
  app.add_option("--batch", o.batch, "samples per step")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of parameters and synthetic data")->capture_default_str();
  app.add_option("--lr", o.lr, "Adam learning rate")->capture_default_str();
  app.add_option("--clip", o.clip, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  app.add_option("--data", o.data,
                 "real data: a text file (language models) or CIFAR-10 .bin files (images); "
                 "seeded synthetic data when absent");
  app.add_flag("--print-graph", o.print_graph, "print the traced graph (op, name, shape, FLOPs)");
  app.add_flag("--profile", o.profile, "time each op kind and print where a step's time goes");
#if defined(HSPMD_HAS_MPI)
  app.add_option("--cluster", o.cluster,
                 "train distributed on this cluster file, one MPI rank per device "
                 "(mpirun -np N ...); single process when absent");
  app.add_option("--plan", o.plan, "with --cluster: the plan to run")
      ->check(CLI::IsMember({"synth", "dp-ev", "dp-cp", "tp"}))
      ->capture_default_str();
  app.add_flag("--explain", o.explain, "with --cluster: print the plan's explain table");
  app.add_flag("--calibrate", o.calibrate,
               "with --cluster: before planning, time the model's ops on rank 0 and the "
               "collectives on all ranks, and price the plan by those measurements");
  app.add_option("--trace", o.trace,
                 "with --cluster: write a Chrome/Perfetto trace (one track per rank: compute, "
                 "collectives with bytes and algorithm, idle) to this file");
#endif
}

/// Traces nothing itself: trains `g` for `o.steps` with Adam, feeding each step with `feed`,
/// and prints the model size, FLOPs per step, progress and a summary. Returns 0.
#if defined(HSPMD_HAS_MPI)
int train_distributed(const std::string& model, const hspmd::graph::graph& g,
                      const common_options& o, const feed_fn& feed);
#endif

inline int train(const std::string& model, const hspmd::graph::graph& g, const common_options& o,
                 const feed_fn& feed) {
#if defined(HSPMD_HAS_MPI)
  if (!o.cluster.empty())
    return train_distributed(model, g, o, feed);
#endif
  std::size_t params = 0;
  for (auto id : g.parameters())
    params += g[id].out.size();
  const auto cost = hspmd::graph::total_cost(g);
  std::printf("%s: %zu parameters, %zu graph nodes, %.3f GFLOP per step (forward %.3f, backward "
              "%.3f), batch %zu\n",
              model.c_str(), params, g.size(), (cost.forward_flops + cost.backward_flops) / 1e9,
              cost.forward_flops / 1e9, cost.backward_flops / 1e9, o.batch);
  if (o.print_graph)
    hspmd::graph::print(std::cout, g);
  hspmd::exec::executor<float> ex(g, o.seed);
  ex.set_profiling(o.profile);
  hspmd::exec::trainer tr(ex, hspmd::exec::adam(o.lr));
  tr.clip = o.clip;
  tr.samples_per_step = o.batch;
  const auto start = std::chrono::steady_clock::now();
  const auto losses = tr.run(
      o.steps,
      [&](hspmd::exec::executor<float>& e, std::size_t step) {
        sink_of<hspmd::exec::executor<float>> sink(e);
        feed(sink, step);
      },
      &std::cout);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!losses.empty())
    std::printf("%s: loss %.4f -> %.4f over %zu steps, %.1f ms/step, %.1f GFLOP/s\n", model.c_str(),
                losses.front(), losses.back(), losses.size(),
                1e3 * seconds / static_cast<double>(losses.size()),
                (cost.forward_flops + cost.backward_flops) * static_cast<double>(losses.size()) /
                    seconds / 1e9);
  if (o.profile)
    hspmd::exec::write_profile(std::cout, ex, losses.size());
  return 0;
}

/// Token sequences from a seeded random first-order Markov chain over `vocab` tokens (each
/// token has 2 likely successors): learnable, unlike uniform noise.
class markov_text {
public:
  markov_text(std::size_t vocab, std::uint64_t seed) : vocab_(vocab), rng_(seed) {
    std::mt19937_64 table(seed ^ 0xabcdefULL);
    next_.resize(vocab * 2);
    for (auto& n : next_)
      n = static_cast<std::int64_t>(table() % vocab);
  }
  void batch(std::size_t batch, std::size_t seq, std::vector<std::int64_t>& tokens,
             std::vector<std::int64_t>& targets) {
    tokens.resize(batch * seq);
    targets.resize(batch * seq);
    for (std::size_t b = 0; b < batch; ++b) {
      auto cur = static_cast<std::int64_t>(rng_() % vocab_);
      for (std::size_t s = 0; s < seq; ++s) {
        const auto nxt = next_[static_cast<std::size_t>(cur) * 2 + rng_() % 2];
        tokens[b * seq + s] = cur;
        targets[b * seq + s] = nxt;
        cur = nxt;
      }
    }
  }

private:
  std::size_t vocab_;
  std::mt19937_64 rng_;
  std::vector<std::int64_t> next_;
};

/// Images of `classes` classes: a fixed random prototype per class plus noise.
class prototype_images {
public:
  prototype_images(std::size_t values, std::size_t classes, std::uint64_t seed)
      : values_(values), classes_(classes), rng_(seed), protos_(values * classes) {
    std::mt19937_64 fixed(seed ^ 0x1234ULL);
    std::normal_distribution<float> nd(0.0F, 1.0F);
    for (auto& v : protos_)
      v = nd(fixed);
  }
  void batch(std::size_t batch, std::vector<float>& x, std::vector<std::int64_t>& y) {
    std::normal_distribution<float> nd(0.0F, 1.0F);
    x.resize(batch * values_);
    y.resize(batch);
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t c = rng_() % classes_;
      y[b] = static_cast<std::int64_t>(c);
      for (std::size_t i = 0; i < values_; ++i)
        x[b * values_ + i] = protos_[c * values_ + i] + 0.5F * nd(rng_);
    }
  }

private:
  std::size_t values_;
  std::size_t classes_;
  std::mt19937_64 rng_;
  std::vector<float> protos_;
};

#if defined(HSPMD_HAS_MPI)
/// The distributed run: every rank reads the cluster, traces (done by the caller), synthesizes
/// the plan or builds the baseline, agrees with the others, and trains; rank 0 prints.
inline int train_distributed(const std::string& model, const hspmd::graph::graph& g,
                             const common_options& o, const feed_fn& feed) {
  int argc = 0;
  char** argv = nullptr;
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([&] {
    namespace synth = hspmd::synth;
    hspmd::mpi_communicator comm;
    const bool root = comm.rank() == 0;
    hspmd::cluster cl = hspmd::load_cluster(o.cluster);
    hspmd::check_rank_count(cl, static_cast<std::size_t>(comm.size()));
    if (!o.trace.empty()) { // fail now, not after training
      std::int32_t ok = 1;
      if (root)
        ok = std::ofstream(o.trace).good() ? 1 : 0;
      comm.broadcast(std::span<std::int32_t>(&ok, 1), 0);
      if (ok == 0)
        throw hspmd::config_error("--trace " + o.trace, "cannot be written",
                                  "give a path in an existing, writable directory");
    }
    synth::synth_options so;
    if (o.calibrate) {
      const auto c0 = std::chrono::steady_clock::now();
      hspmd::exec::profile_options po;
      po.seed = o.seed;
      po.slowdown = cl.devices.at(0).slowdown;
      so.profile =
          hspmd::exec::measure_compute_on_rank0<float>(g, cl.devices.at(0).speed, comm, po);
      cl.set_collective_costs(hspmd::calibrate_collectives(comm));
      if (root) {
        double step = 0.0;
        for (double x : so.profile->seconds)
          step += x;
        const auto ar = cl.cost_model().params(hspmd::collective::all_reduce,
                                               hspmd::uneven_algorithm::native, 1 << 20);
        std::printf("calibrated in %.1f s: forward+backward %.2f ms at full batch on %s; "
                    "all-reduce of 1 MiB %.3f ms\n",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count(),
                    1e3 * step, cl.devices[0].name.c_str(), 1e3 * (ar.alpha + ar.beta * (1 << 20)));
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    const synth::plan p =
        o.plan == "synth"   ? synth::synthesize(g, cl, so, model)
        : o.plan == "dp-ev" ? synth::make_baseline(g, cl, synth::baseline::dp_ev, so, model)
        : o.plan == "dp-cp" ? synth::make_baseline(g, cl, synth::baseline::dp_cp, so, model)
                            : synth::make_baseline(g, cl, synth::baseline::tp, so, model);
    const double plan_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto me = static_cast<std::size_t>(comm.rank());
    if (root) {
      std::printf("%s: %zu graph nodes, batch %zu, cluster \"%s\" (%zu ranks)\n", model.c_str(),
                  g.size(), o.batch, cl.name.c_str(), cl.size());
      std::printf("plan %s (%.0f ms): predicted step %.2f ms; shares", p.strategy.c_str(),
                  1e3 * plan_seconds, 1e3 * p.step_time);
      for (std::size_t d = 0; d < p.device_names.size(); ++d)
        std::printf(" %s %.1f%%", p.device_names[d].c_str(), 100.0 * p.ratios[0][d]);
      std::printf("\n");
      if (o.explain)
        std::cout << synth::explain(
            p, synth::cost_model(g, cl, synth::segment_map(g, p.segments), so.profile));
    }
    hspmd::exec::distributed_executor<float, hspmd::mpi_communicator> dx(g, p, comm, o.seed);
    dx.set_slowdown(cl.devices.at(me).slowdown);
    hspmd::exec::adam opt(o.lr);
    sink_of<decltype(dx)> sink(dx);
    if (root)
      std::printf("gradients: %.2f MiB on rank 0 in shared buffers (%.2f MiB with one per "
                  "tensor version)\n",
                  static_cast<double>(dx.gradient_bytes()) / 1048576.0,
                  static_cast<double>(dx.gradient_bytes_unshared()) / 1048576.0);
    if (!o.trace.empty())
      dx.start_trace();
    std::vector<double> times;
    double first = 0.0;
    double last = 0.0;
    for (std::size_t s = 0; s < o.steps; ++s) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      feed(sink, s);
      const auto fed = std::chrono::steady_clock::now();
      dx.set_step(s);
      const double loss = dx.forward();
      dx.backward();
      if (o.clip > 0.0)
        dx.clip_grad_norm(o.clip);
      dx.update(opt);
      const auto done = std::chrono::steady_clock::now();
      dx.trace().add("input", hspmd::exec::trace_kind::compute, start, fed);
      dx.trace().add("step " + std::to_string(s), hspmd::exec::trace_kind::step, start, done,
                     {{"loss", loss}});
      const double step = comm.all_reduce(std::chrono::duration<double>(done - start).count(),
                                          hspmd::reduce_op::max);
      times.push_back(step);
      (s == 0 ? first : last) = loss;
      last = loss;
      if (root && (s + 1 == o.steps || (s + 1) % std::max<std::size_t>(1, o.steps / 20) == 0)) {
        const std::size_t width = 24;
        std::string bar(width * (s + 1) / o.steps, '#');
        bar.resize(width, '.');
        std::printf("step %5zu/%-5zu [%s] loss %10.4f  %8.2f ms/step\n", s + 1, o.steps,
                    bar.c_str(), loss, 1e3 * step);
        std::fflush(stdout);
      }
    }
    if (!o.trace.empty()) {
      std::vector<std::string> devices;
      for (const auto& d : cl.devices)
        devices.push_back(
            d.name + (d.slowdown > 1.0
                          ? ", emulated " + std::to_string(d.slowdown).substr(0, 4) + "x slower"
                          : ""));
      const auto trace = dx.collect_trace(devices);
      if (root) {
        std::ofstream(o.trace) << trace.dump() << "\n";
        std::printf("trace: %zu events of %zu ranks in %s (open in ui.perfetto.dev)\n",
                    trace["traceEvents"].size(), cl.size(), o.trace.c_str());
      }
    }
    if (root && !times.empty()) {
      auto sorted = times;
      if (sorted.size() > 2)
        sorted.erase(sorted.begin()); // the first step warms up
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted[sorted.size() / 2];
      std::printf("%s: loss %.4f -> %.4f over %zu steps; step time measured %.2f ms (median), "
                  "predicted %.2f ms (%+.0f%%)\n",
                  model.c_str(), first, last, times.size(), 1e3 * median, 1e3 * p.step_time,
                  100.0 * (p.step_time - median) / median);
    }
    return 0;
  });
}
#endif

/// Runs `body` and turns an hspmd error into one line on stderr and exit code 1.
template <class F>
int guarded(F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

} // namespace example
