#pragma once
// The trainer's engine of one rank of a distributed run (train/engine.hpp `rank_engine`) over
// `distributed_executor<T, Comm, B>`: the host over MPI (train/trainer_impl.hpp) or a device
// backend over its own communicator (train/cuda_engine.cuh: CUDA over NCCL).

#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/exec/reshard.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/namespace.hpp>

#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace hspmd::train {

template <std::floating_point T, class Optimizer, class Comm, backend B>
class distributed_engine final : public rank_engine<T, Optimizer> {
public:
  /// `keep` holds what the communicator needs alive (e.g. the NCCL communicator it is).
  distributed_engine(const graph::graph& g, const synth::plan& p, Comm& comm, std::uint64_t seed,
                     B be = {}, std::string device = {}, std::shared_ptr<void> keep = {})
      : keep_(std::move(keep)), g_(&g), comm_(&comm), seed_(seed),
        dx_(std::make_unique<dx_t>(g, p, comm, seed, std::move(be))),
        device_(device.empty() ? std::string(dx_->local().backend().name()) : std::move(device)) {}
  void set_input(std::string_view n, std::span<const T> v) override { dx_->set_input(n, v); }
  void set_input(std::string_view n, std::span<const std::int64_t> v) override {
    dx_->set_input(n, v);
  }
  using batch_sink<T>::set_input;
  executor<T, host_backend>* host_executor() override {
    return detail::host_executor_of(dx_->local());
  }
  std::string device() const override { return device_; }
  void set_profiling(bool on) override {
    profiling_ = on;
    dx_->local().set_profiling(on);
  }
  std::vector<profile_entry> profile() const override { return dx_->local().profile(); }
  std::optional<memory_stats> memory() const override {
    return detail::memory_of(dx_->local().backend());
  }
  void set_step(std::size_t s) override { dx_->set_step(s); }
  void set_training(bool on) override { dx_->set_training(on); }
  void set_precision(exec::precision p) override {
    precision_ = p;
    dx_->local().set_precision(p);
  }
  void set_loss_scale(double scale) override { dx_->local().set_loss_scale(scale); }
  std::size_t recompute() override {
    recompute_ = true;
    return dx_->recompute();
  }
  double forward() override { return static_cast<double>(dx_->forward()); }
  void backward() override { dx_->backward(); }
  void accumulate(std::size_t micro, std::size_t count) override {
    acc_.add(dx_->local(), micro, count);
  }
  double grad_norm() override { return std::sqrt(dx_->grad_norm_squared()); }
  void step(Optimizer& opt, double scale) override { dx_->update(opt, scale); }
  std::vector<T> whole(graph::node_id id) override { return dx_->gather((*g_)[id].name); }
  double slowest(double seconds) override {
    return detail::control_of(*comm_).all_reduce(seconds, reduce_op::max);
  }
  void barrier() override { detail::control_of(*comm_).barrier(); }
  bool root() const override { return comm_->rank() == 0; }
  void step_span(std::size_t s, std::chrono::steady_clock::time_point start,
                 std::chrono::steady_clock::time_point fed,
                 std::chrono::steady_clock::time_point done, double loss) override {
    dx_->trace().add("input", trace_kind::compute, start, fed);
    dx_->trace().add("step " + std::to_string(s), trace_kind::step, start, done, {{"loss", loss}});
  }
  void set_slowdown(double s) override { dx_->set_slowdown(s); }
  void set_bucket_bytes(std::size_t bytes) override { dx_->set_bucket_bytes(bytes); }
  std::size_t gradient_bytes() const override { return dx_->gradient_bytes(); }
  std::size_t gradient_bytes_unshared() const override { return dx_->gradient_bytes_unshared(); }
  double take_compute_seconds() override { return dx_->take_compute_seconds(); }
  void rebalance(const synth::plan& p, Optimizer& opt) override {
    if constexpr (!host_memory_v<B> || !std::is_copy_constructible_v<B>) {
      (void)p;
      (void)opt;
      throw config_error("re-balancing on " + device_,
                         "is built for host tensors only (a device engine's buffers and streams "
                         "are not moved yet)",
                         "train without re-balancing on this device");
    } else {
      ram_.relayout(); // the RAM tier's slots follow the layout
      auto next = std::make_unique<dx_t>(*g_, p, *comm_, seed_, B(dx_->local().backend()));
      next->set_slowdown(dx_->slowdown());
      next->set_bucket_bytes(dx_->bucket_bytes());
      next->local().set_profiling(profiling_);
      next->local().set_precision(precision_);
      if (recompute_)
        next->recompute();
      next->trace() = std::move(dx_->trace());
      move_state(*dx_, *next, opt);
      dx_ = std::move(next);
      acc_ = {};
    }
  }
  void trace_event(std::string name, std::chrono::steady_clock::time_point begin,
                   std::chrono::steady_clock::time_point end, nlohmann::json args) override {
    dx_->trace().add(std::move(name), trace_kind::step, begin, end, std::move(args));
  }
  void start_trace() override { dx_->start_trace(); }
  nlohmann::json collect_trace(const std::vector<std::string>& devices) override {
    return dx_->collect_trace(devices);
  }
  [[nodiscard]] distributed_executor<T, Comm, B>& executor_of() noexcept { return *dx_; }
  std::filesystem::path save_state(const std::filesystem::path& root, std::size_t step,
                                   const nlohmann::json& meta, Optimizer& opt,
                                   const checkpoint_options& co) override {
    if constexpr (std::same_as<B, host_backend>) {
      const auto t = training_tensors<T>(*g_, &dx_->program(), dx_->local(), opt);
      return save_training<T>(detail::control_of(*comm_), root, step,
                              std::span<const training_tensor<T>>(t), meta, co);
    } else {
      return rank_engine<T, Optimizer>::save_state(root, step, meta, opt, co);
    }
  }
  bool keeps_ram_tier() const override { return std::same_as<B, host_backend>; }
  void ram_save(std::size_t step, const nlohmann::json& meta, Optimizer& opt,
                const ram_options& ro) override {
    if constexpr (std::same_as<B, host_backend>) {
      const auto t = training_tensors<T>(*g_, &dx_->program(), dx_->local(), opt);
      ram_.save(detail::control_of(*comm_), ro, step, std::span<const training_tensor<T>>(t), meta);
    } else {
      rank_engine<T, Optimizer>::ram_save(step, meta, opt, ro);
    }
  }
  void ram_start(Optimizer& opt, const ram_options& ro) override {
    if constexpr (std::same_as<B, host_backend>) {
      const auto t = training_tensors<T>(*g_, &dx_->program(), dx_->local(), opt);
      ram_.start(detail::control_of(*comm_), ro, std::span<const training_tensor<T>>(t));
    } else {
      rank_engine<T, Optimizer>::ram_start(opt, ro);
    }
  }
  void ram_poll() override { ram_.poll(); }
  ram_stats ram_finish() override { return ram_.finish(); }
  checkpoint_info load_state(const std::filesystem::path& path, Optimizer& opt,
                             bool parameters_only) override {
    if constexpr (std::same_as<B, host_backend>) {
      const auto t = training_tensors<T>(*g_, &dx_->program(), dx_->local(), opt);
      return load_training<T>(detail::control_of(*comm_), path,
                              std::span<const training_tensor<T>>(t), parameters_only);
    } else {
      return rank_engine<T, Optimizer>::load_state(path, opt, parameters_only);
    }
  }

private:
  using dx_t = distributed_executor<T, Comm, B>;

  // Every parameter of `to`'s program takes its values, and its optimizer slots, from the
  // version of the same tensor in `from`'s (the same placement where `from` has it): one
  // all-to-all over the control communicator (host memory).
  void move_state(dx_t& from, dx_t& to, Optimizer& opt) {
    const program::local_program& a = from.program();
    const program::local_program& b = to.program();
    const auto pa = a.local.parameters();
    const auto pb = b.local.parameters();
    std::vector<std::size_t> source(pb.size());
    for (std::size_t j = 0; j < pb.size(); ++j) {
      std::optional<std::size_t> found;
      for (std::size_t i = 0; i < pa.size(); ++i)
        if (a.global[pa[i]] == b.global[pb[j]] &&
            (!found || (a.where[pa[i]] == b.where[pb[j]] && a.where[pa[*found]] != b.where[pb[j]])))
          found = i;
      if (!found)
        throw plan_error("re-balancing",
                         "parameter " + (*g_)[b.global[pb[j]]].name +
                             " has no version in the running program",
                         "re-balance to a plan of the same graph");
      source[j] = *found;
    }
    std::vector<reshard_item<T>> items;
    const auto item = [&](std::size_t j, std::span<const T> before, std::span<T> after) {
      items.push_back({boxes_of(a, pa[source[j]]), boxes_of(b, pb[j]), before, after,
                       (*g_)[b.global[pb[j]]].name});
    };
    for (std::size_t j = 0; j < pb.size(); ++j)
      item(j, from.local().value(pa[source[j]]), to.local().value(pb[j]));
    if constexpr (requires { opt.state(); }) {
      // Slots exist once the optimizer has stepped (every rank has stepped as often).
      auto& slots = opt.state().template of<T, B>();
      const bool stepped = slots.a.size() == pa.size() && !pa.empty();
      B& be = to.local().backend();
      using buffers = std::remove_reference_t<decltype(slots.a)>;
      buffers na(pb.size());
      buffers nb(pb.size());
      if (stepped)
        for (std::size_t j = 0; j < pb.size(); ++j) {
          const std::size_t n = to.local().value(pb[j]).size();
          const auto& oa = slots.a[source[j]];
          na[j] = be.template allocate<T>(n);
          item(j, std::span<const T>(oa.data(), oa.size()), std::span<T>(na[j].data(), n));
          if constexpr (Optimizer::state_slots > 1) {
            const auto& ob = slots.b[source[j]];
            nb[j] = be.template allocate<T>(n);
            item(j, std::span<const T>(ob.data(), ob.size()), std::span<T>(nb[j].data(), n));
          }
        }
      reshard(detail::control_of(*comm_), std::span<const reshard_item<T>>(items));
      if (stepped) {
        slots.a = std::move(na);
        slots.b = std::move(nb);
      }
    } else {
      throw config_error("re-balancing with optimizer " + std::string(typeid(Optimizer).name()),
                         "its state is private to it, so it cannot be moved to the new pieces",
                         "give the optimizer a state() like exec::adam's, or train without "
                         "re-balancing");
    }
  }

  std::shared_ptr<void> keep_; // destroyed last
  const graph::graph* g_;
  Comm* comm_;
  std::uint64_t seed_;
  std::unique_ptr<dx_t> dx_;
  ram_keeper<T, exec::detail::control_t<Comm>> ram_;
  std::string device_;
  bool profiling_ = false;
  exec::precision precision_ = exec::precision::f32;
  bool recompute_ = false; // re-applied to a re-balanced executor
  gradient_accumulator<T, B> acc_;
};

} // namespace hspmd::train
