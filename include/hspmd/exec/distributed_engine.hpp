#pragma once
// The trainer's engine of one rank of a distributed run (exec/engine.hpp `rank_engine`) over
// `distributed_executor<T, Comm, B>`: the host over MPI (exec/trainer_impl.hpp) or a device
// backend over its own communicator (exec/backends/cuda_engine.cuh: CUDA over NCCL).

#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/exec/engine.hpp>

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
#include <utility>
#include <vector>

namespace hspmd::exec {

template <std::floating_point T, class Optimizer, class Comm, backend B>
class distributed_engine final : public rank_engine<T, Optimizer> {
public:
  /// `keep` holds what the communicator needs alive (e.g. the NCCL communicator it is).
  distributed_engine(const graph::graph& g, const synth::plan& p, Comm& comm, std::uint64_t seed,
                     B be = {}, std::string device = {}, std::shared_ptr<void> keep = {})
      : keep_(std::move(keep)), g_(&g), comm_(&comm), dx_(g, p, comm, seed, std::move(be)),
        device_(device.empty() ? std::string(dx_.local().backend().name()) : std::move(device)) {}
  void set_input(std::string_view n, std::span<const T> v) override { dx_.set_input(n, v); }
  void set_input(std::string_view n, std::span<const std::int64_t> v) override {
    dx_.set_input(n, v);
  }
  using batch_sink<T>::set_input;
  executor<T, host_backend>* host_executor() override {
    return detail::host_executor_of(dx_.local());
  }
  std::string device() const override { return device_; }
  void set_profiling(bool on) override { dx_.local().set_profiling(on); }
  std::vector<profile_entry> profile() const override { return dx_.local().profile(); }
  std::optional<memory_stats> memory() const override {
    return detail::memory_of(dx_.local().backend());
  }
  void set_step(std::size_t s) override { dx_.set_step(s); }
  void set_training(bool on) override { dx_.set_training(on); }
  void set_precision(exec::precision p) override { dx_.local().set_precision(p); }
  void set_loss_scale(double scale) override { dx_.local().set_loss_scale(scale); }
  double forward() override { return static_cast<double>(dx_.forward()); }
  void backward() override { dx_.backward(); }
  void accumulate(std::size_t micro, std::size_t count) override {
    acc_.add(dx_.local(), micro, count);
  }
  double grad_norm() override { return std::sqrt(dx_.grad_norm_squared()); }
  void step(Optimizer& opt, double scale) override { dx_.update(opt, scale); }
  std::vector<T> whole(graph::node_id id) override { return dx_.gather((*g_)[id].name); }
  double slowest(double seconds) override {
    return detail::control_of(*comm_).all_reduce(seconds, reduce_op::max);
  }
  void barrier() override { detail::control_of(*comm_).barrier(); }
  bool root() const override { return comm_->rank() == 0; }
  void step_span(std::size_t s, std::chrono::steady_clock::time_point start,
                 std::chrono::steady_clock::time_point fed,
                 std::chrono::steady_clock::time_point done, double loss) override {
    dx_.trace().add("input", trace_kind::compute, start, fed);
    dx_.trace().add("step " + std::to_string(s), trace_kind::step, start, done, {{"loss", loss}});
  }
  void set_slowdown(double s) override { dx_.set_slowdown(s); }
  void set_bucket_bytes(std::size_t bytes) override { dx_.set_bucket_bytes(bytes); }
  std::size_t gradient_bytes() const override { return dx_.gradient_bytes(); }
  std::size_t gradient_bytes_unshared() const override { return dx_.gradient_bytes_unshared(); }
  void start_trace() override { dx_.start_trace(); }
  nlohmann::json collect_trace(const std::vector<std::string>& devices) override {
    return dx_.collect_trace(devices);
  }
  [[nodiscard]] distributed_executor<T, Comm, B>& executor_of() noexcept { return dx_; }

private:
  std::shared_ptr<void> keep_; // destroyed last
  const graph::graph* g_;
  Comm* comm_;
  distributed_executor<T, Comm, B> dx_;
  std::string device_;
  gradient_accumulator<T, B> acc_;
};

} // namespace hspmd::exec
