#pragma once
// The trainer's engine of one rank of a pipeline run (train/engine.hpp `engine` over
// exec/pipeline.hpp's `pipeline_executor`): the trainer's micro-batches of a step (its
// `accumulate`) are the pipeline's m. The trainer feeds them one at a time and calls `forward`
// after each; the engine keeps them and, at the step's last, runs the whole step in the
// schedule's order (every micro-batch's forward and backward) and returns m times the batch's
// mean loss, so the trainer's mean over the micro-batches is the batch's. `backward` and
// `accumulate` have nothing left to do: the pipeline accumulated the gradients and synchronized
// them in each group.
//
// Optimizers: one per chunk of this rank (its state follows the chunk's parameters), copies of
// the trainer's without its state; each step takes the trainer's learning rate and gives its
// step count back (Adam's bias correction, checkpoints). An evaluation micro-batch runs through
// the pipeline as a step of m copies of itself with training off (the mean loss is its loss;
// the gradients are dropped at the next step): m times its work, and correct for any m.

#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/exec/pipeline.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/pipeline_checkpoint.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::train {

template <std::floating_point T, class Optimizer, class Comm>
class pipeline_engine final : public engine<T, Optimizer> {
public:
  /// `micro_graph`: the model traced for one micro-batch (the trainer's graph).
  pipeline_engine(const graph::graph& micro_graph, const program::pipeline_plan& plan, Comm& world,
                  std::uint64_t seed)
      : g_(&micro_graph), world_(&world), px_(micro_graph, plan, world, seed) {}

  void set_input(std::string_view n, std::span<const T> v) override {
    values_[std::string(n)].emplace_back(v.begin(), v.end());
  }
  void set_input(std::string_view n, std::span<const std::int64_t> v) override {
    ids_[std::string(n)].emplace_back(v.begin(), v.end());
  }
  using batch_sink<T>::set_input;
  std::string device() const override { return "host"; }
  void set_profiling(bool on) override {
    if (on)
      refuse("--profile", "per-op profiles of pipeline stages are not collected yet");
  }
  std::vector<profile_entry> profile() const override { return {}; }
  void set_step(std::size_t s) override { px_.set_step(s / micro()); }
  void set_training(bool on) override {
    training_ = on;
    px_.set_training(on);
  }
  void set_precision(exec::precision p) override {
    if (p != exec::precision::f32)
      refuse("--precision " + std::string(name(p)), "pipeline stages run in f32 for now");
  }
  void set_loss_scale(double scale) override {
    if (scale != 1.0)
      refuse("a loss scale", "pipeline stages run in f32 for now");
  }
  std::size_t recompute() override { return px_.recompute(); }
  double forward() override {
    const std::size_t m = micro();
    if (training_) {
      if (++fed_ < m)
        return 0.0;
      return run(1) * static_cast<double>(m);
    }
    return run(m); // evaluation: one micro-batch, m copies of it
  }
  void backward() override {}
  void accumulate(std::size_t, std::size_t) override {}
  double grad_norm() override { return std::sqrt(px_.grad_norm_squared()); }
  void step(Optimizer& opt, double scale) override {
    std::vector<Optimizer>& opts = optimizers(opt);
    for (Optimizer& o : opts) {
      o.lr = opt.lr;
      if constexpr (requires { opt.set_steps(opt.steps()); })
        o.set_steps(opt.steps());
    }
    px_.update(std::span<Optimizer>(opts), scale);
    if constexpr (requires { opt.set_steps(opt.steps()); })
      opt.set_steps(opts.front().steps());
  }
  std::vector<T> whole(graph::node_id id) override { return px_.gather_parameter((*g_)[id].name); }
  double slowest(double seconds) override { return world_->all_reduce(seconds, reduce_op::max); }
  void barrier() override { world_->barrier(); }
  bool root() const override { return world_->rank() == 0; }
  std::filesystem::path save_state(const std::filesystem::path& root, std::size_t step,
                                   const nlohmann::json& meta, Optimizer& opt,
                                   const checkpoint_options& co) override {
    const auto t = pipeline_training_tensors(px_, std::span<Optimizer>(optimizers(opt)));
    return save_training<T>(*world_, root, step, std::span<const training_tensor<T>>(t), meta, co);
  }
  checkpoint_info load_state(const std::filesystem::path& path, Optimizer& opt,
                             bool parameters_only) override {
    const auto t = pipeline_training_tensors(px_, std::span<Optimizer>(optimizers(opt)));
    return load_training<T>(*world_, path, std::span<const training_tensor<T>>(t), parameters_only);
  }

  /// The trace's stages, micro-batches and boundary receives (exec/pipeline.hpp), each rank's
  /// track named by `devices` or, given none, by those of `set_device_names`.
  void start_trace() override { px_.start_trace(); }
  nlohmann::json collect_trace(const std::vector<std::string>& devices) override {
    return px_.collect_trace(devices.empty() ? devices_ : devices);
  }
  void set_device_names(std::vector<std::string> devices) { devices_ = std::move(devices); }

  [[nodiscard]] exec::pipeline_executor<T, Comm>& pipeline() noexcept { return px_; }

private:
  [[nodiscard]] std::size_t micro() const noexcept { return px_.plan().micro; }
  [[noreturn]] static void refuse(const std::string& what, const std::string& why) {
    throw config_error(what + " with --pipeline", why, "drop it, or train without --pipeline");
  }
  // The step over the micro-batches fed (each `copies` times); their mean loss.
  double run(std::size_t copies) {
    const auto whole = [&](auto& fed) {
      for (auto& [name, parts] : fed) {
        std::vector<typename std::decay_t<decltype(parts)>::value_type::value_type> all;
        for (const auto& part : parts)
          for (std::size_t k = 0; k < copies; ++k)
            all.insert(all.end(), part.begin(), part.end());
        px_.set_input(name, std::span<const typename decltype(all)::value_type>(all));
      }
      fed.clear();
    };
    whole(values_);
    whole(ids_);
    fed_ = 0;
    return static_cast<double>(px_.forward_backward());
  }
  // One optimizer per chunk (see the file comment), made on first use.
  std::vector<Optimizer>& optimizers(const Optimizer& like) {
    if (opts_.empty())
      for (std::size_t c = 0; c < px_.chunks(); ++c) {
        opts_.push_back(like);
        if constexpr (requires { opts_.back().state(); })
          opts_.back().state() = {}; // (a copy shares the original's slots)
      }
    return opts_;
  }

  const graph::graph* g_;
  Comm* world_;
  exec::pipeline_executor<T, Comm> px_;
  std::map<std::string, std::vector<std::vector<T>>> values_;
  std::map<std::string, std::vector<std::vector<std::int64_t>>> ids_;
  std::size_t fed_ = 0;
  bool training_ = true;
  std::vector<Optimizer> opts_;
  std::vector<std::string> devices_;
};

} // namespace hspmd::train
