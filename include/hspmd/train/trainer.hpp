#pragma once
// The library trainer: owns the training loop of a model, in one process or on every rank of an
// MPI job, so a user's trainer is a model function, a feed and a few options.
//
//     train::train_options o;
//     o.batch = 12;  o.steps = 100;  o.cluster = "clusters/emulated-3.json";  // none: 1 process
//     o.lr = train::lr_schedule::cosine(3e-3, /*warmup=*/10);
//     train::trainer<float> tr(my_model, o);          // traces, plans, agrees, materializes
//     auto r = tr.fit([&](exec::batch_sink<float>& b, std::size_t i) {
//       b.set_input("x", xs(i));  b.set_input("labels", ys(i));  // the whole batch, every rank
//     });
//
// With a cluster the trainer is collective: every rank constructs it with the same model and
// options, reads the cluster, synthesizes (or builds, or loads) the plan, checks that the ranks
// agree on model, cluster, ratios and plan, emulates its device's slowdown, and trains its piece.
// A failure on any rank then ends the job with one line naming the rank (comm/mpi/guard.hpp), so
// no rank is left waiting in a collective.
//
// One step = `accumulate` micro-batches of `batch` samples (forward, backward, gradients summed
// and averaged), global-norm clipping, the learning rate of the schedule, the optimizer. Root
// prints a progress line (loss, learning rate, ms/step, throughput, ETA), evaluates without
// backward every `eval_every` steps and at the end (loss, accuracy or perplexity), and writes
// the per-step metrics as JSON lines and, distributed, a Chrome trace with step spans.
//
// Header-only by default: this header declares the trainer and includes its implementation
// (train/trainer_impl.hpp: executors, synthesizer, MPI). Define HSPMD_COMPILED (link
// hspmd::compiled, which does) and a trainer's translation unit parses only the declarations:
// trainer<float> and trainer<double> with Adam are compiled once into that library; other
// optimizers include <hspmd/train/trainer_impl.hpp> themselves.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/batch_sink.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/results.hpp>
#include <hspmd/train/train_options.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
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
#include <vector>

namespace hspmd::nn {
class tracer;
}
namespace hspmd::synth {
struct plan;
}

namespace hspmd::exec {
template <std::floating_point T, backend B>
class executor;
class adam;
} // namespace hspmd::exec

namespace hspmd::train {

namespace detail {
template <std::floating_point T, class Optimizer>
class trainer_state;
} // namespace detail

// lr_schedule, eval_metric and train_options: train/train_options.hpp.

/// A model: records its inputs, layers and loss on the tracer (whose batch is bound).
using model_fn = std::function<void(nn::tracer&)>;

// step_report, eval_report, rebalance_report and train_result: train/results.hpp.

/// Trains a model (see the file comment). Collective when the options name a cluster: every
/// rank constructs it with the same model and options; a failure on any rank ends the job.
template <std::floating_point T = float, class Optimizer = adam>
class trainer {
public:
  /// Traces `model` with the options' batch, then plans (distributed) and materializes it.
  /// Throws `config_error`/`plan_error` for bad options (one process).
  trainer(const model_fn& model, const train_options& o);
  /// Trains an already traced graph: its batch is the micro-batch (`o.batch` is ignored).
  trainer(graph::graph g, train_options o);
  ~trainer();
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// Called after every step on every rank (with the same report).
  std::function<void(const step_report&)> on_step;
  /// Called after every evaluation on every rank.
  std::function<void(const eval_report&)> on_eval;

  /// Trains `options().steps` steps; `eval` (optional) feeds the evaluation batches, run every
  /// `eval_every` steps and after the last. Collective.
  train_result fit(const feed_fn<T>& feed, const feed_fn<T>& eval = {});
  /// One evaluation pass of `batches` micro-batches (forward only, dropout off). Collective.
  eval_report evaluate(const feed_fn<T>& eval, std::size_t batches, std::size_t after_step = 0);

  [[nodiscard]] const graph::graph& graph() const;
  [[nodiscard]] const train_options& options() const;
  /// The plan of a distributed run; nullptr in one process.
  [[nodiscard]] const synth::plan* plan() const;
  /// This process's executor: the whole model, or this rank's pieces. Throws `config_error`
  /// when the tensors live on a device (see `value`).
  [[nodiscard]] executor<T, host_backend>& local();
  /// The whole value of the floating-point node `name` (a parameter, a layer's output), copied
  /// to the host. Collective when distributed.
  [[nodiscard]] std::vector<T> value(std::string_view name);
  /// Where the tensors live: "host", or the device engine's description.
  [[nodiscard]] std::string device() const;
  [[nodiscard]] Optimizer& optimizer();
  /// True on rank 0 (and in one process): the rank that prints and writes files.
  [[nodiscard]] bool root() const;

private:
  std::unique_ptr<detail::trainer_state<T, Optimizer>> s_;
};

#if defined(HSPMD_COMPILED)
// Compiled once into hspmd::compiled (src/trainer.cpp).
extern template class trainer<float, adam>;
extern template class trainer<double, adam>;
#endif

} // namespace hspmd::train

#if !defined(HSPMD_COMPILED)
#include <hspmd/train/trainer_impl.hpp>
#endif
