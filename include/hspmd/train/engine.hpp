#pragma once
// What the library trainer's loop drives: an engine is one process's (or one rank's) executor
// with the step's pieces as calls (feed, forward, backward, micro-batch accumulation, the
// gradient norm, the optimizer step), whatever backend holds its tensors.
//
// `backend_engine<T, Optimizer, B>` is the engine of one process on any backend. The host one is
// built in; a device backend that needs its own compiler registers a factory under a name
// (`device_engines<T, Optimizer>()`, `register_device_engine`): hspmd::cuda's src/cuda_engine.cu
// registers "cuda" when its object is linked, so the trainer (train/trainer_impl.hpp), compiled
// by the host compiler, picks a GPU with `train_options::device` and includes no CUDA header.

#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/batch_sink.hpp>
#include <hspmd/exec/caching_allocator.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/op_profile.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/kernels/shape.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/profile.hpp>
#include <hspmd/train/ram_keeper.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd {
class mpi_communicator;
namespace synth {
struct plan;
}
} // namespace hspmd

namespace hspmd::train {

/// The last micro-batch of an accumulated step: g[i] = (sum[i] + g[i]) * scale, the mean over
/// the step's micro-batches, rounded as summing into `sum` and then scaling.
template <class T>
struct mean_of_micro_batches {
  const T* sum;
  T* g;
  T scale;
  HSPMD_HD void operator()(std::size_t i) const { g[i] = (sum[i] + g[i]) * scale; }
};

/// Gradient accumulation over micro-batches in buffers of the executor's backend (allocated at
/// the first accumulated step, reused).
template <std::floating_point T, backend B>
class gradient_accumulator {
public:
  /// After micro-batch `micro` of `count`: sums the parameters' gradients; after the last one
  /// the gradients hold the mean over all `count`.
  void add(executor<T, B>& ex, std::size_t micro, std::size_t count) {
    const auto params = ex.graph().parameters();
    B& be = ex.backend();
    if (sums_.size() != params.size()) {
      sums_.clear();
      for (graph::node_id id : params)
        sums_.push_back(be.template allocate<T>(ex.grad(id).size()));
    }
    const bool last = micro + 1 == count;
    const T scale = T{1} / static_cast<T>(count);
    for (std::size_t p = 0; p < params.size(); ++p) {
      const std::span<T> g = ex.grad(params[p]);
      T* sum = sums_[p].data();
      if (last && micro > 0)
        for_each_index(be, g.size(), mean_of_micro_batches<T>{sum, g.data(), scale});
      else if (!last)
        for_each_index(be, g.size(), copy_elements<T>{g.data(), sum, micro > 0});
    }
  }

private:
  std::vector<typename B::template buffer<T>> sums_;
};

namespace detail {
// The host executor of an engine's executor, or nullptr when its tensors live on a device.
template <std::floating_point T, backend B>
[[nodiscard]] executor<T, host_backend>* host_executor_of(executor<T, B>& ex) {
  if constexpr (std::is_same_v<B, host_backend>)
    return &ex;
  else
    return nullptr;
}
// The backend allocator's books, where it keeps them (`memory()`).
template <class B>
[[nodiscard]] std::optional<memory_stats> memory_of(const B& b) {
  if constexpr (requires {
                  { b.memory() } -> std::convertible_to<memory_stats>;
                })
    return b.memory();
  else
    return std::nullopt;
}
} // namespace detail

/// One process or one rank: what the trainer's loop needs from an executor.
template <std::floating_point T, class Optimizer>
class engine : public batch_sink<T> {
public:
  /// The host executor, or nullptr when the tensors live on a device.
  [[nodiscard]] virtual executor<T, host_backend>* host_executor() { return nullptr; }
  /// Where the tensors live, as the trainer prints it ("host", "cuda:0 (NVIDIA H100 ...)").
  [[nodiscard]] virtual std::string device() const = 0;
  virtual void set_profiling(bool on) = 0;
  [[nodiscard]] virtual std::vector<profile_entry> profile() const = 0;
  /// The device allocator's books, where the backend keeps them (`memory()`).
  [[nodiscard]] virtual std::optional<memory_stats> memory() const { return std::nullopt; }
  virtual void set_step(std::size_t s) = 0;
  virtual void set_training(bool on) = 0;
  /// Mixed precision (kernels/precision.hpp), before the first forward.
  virtual void set_precision(exec::precision p) = 0;
  /// The backward's seed (f16's dynamic loss scale): gradients come out multiplied by it.
  virtual void set_loss_scale(double scale) = 0;
  /// Activation recomputation of the model's blocks (exec::executor::recompute), before the
  /// first forward; returns the bytes of the buffer the blocks' inner values share.
  virtual std::size_t recompute() = 0;
  virtual double forward() = 0;
  virtual void backward() = 0;
  /// After micro-batch `micro` of `count` (count > 1): see gradient_accumulator::add.
  virtual void accumulate(std::size_t micro, std::size_t count) = 0;
  virtual double grad_norm() = 0; ///< the global L2 norm of the gradients (one reduction)
  /// The optimizer's step with the gradients scaled by `scale` (clipping).
  virtual void step(Optimizer& opt, double scale) = 0;
  /// The whole value of a float node of the traced graph, on every rank (collective).
  [[nodiscard]] virtual std::vector<T> whole(graph::node_id id) = 0;
  [[nodiscard]] virtual double slowest(double seconds) = 0; ///< max over ranks
  virtual void barrier() = 0;
  [[nodiscard]] virtual bool root() const = 0;
  /// Starts recording a trace of the run (collective; an engine that records none ignores it).
  virtual void start_trace() {}
  /// Collective; rank 0 gets the whole trace (exec/trace.hpp), `devices` naming each rank's
  /// device; null from an engine that records none.
  [[nodiscard]] virtual nlohmann::json collect_trace(const std::vector<std::string>& devices) {
    (void)devices;
    return nullptr;
  }
  virtual void step_span(std::size_t, std::chrono::steady_clock::time_point,
                         std::chrono::steady_clock::time_point,
                         std::chrono::steady_clock::time_point, double) {}
  /// Saves the parameters and `opt`'s state as checkpoint `step` under `root`, `meta` in its
  /// manifest (train/checkpoint.hpp). Collective. Throws `config_error` where the engine cannot.
  virtual std::filesystem::path save_state(const std::filesystem::path& root, std::size_t step,
                                           const nlohmann::json& meta, Optimizer& opt,
                                           const checkpoint_options& co) {
    (void)root, (void)step, (void)meta, (void)opt, (void)co;
    throw no_checkpoints();
  }
  /// Loads the parameters and `opt`'s state (with `parameters_only`, the parameters alone) from
  /// the checkpoint `path` names, whatever layout it was saved under. Collective.
  virtual checkpoint_info load_state(const std::filesystem::path& path, Optimizer& opt,
                                     bool parameters_only) {
    (void)path, (void)opt, (void)parameters_only;
    throw no_checkpoints();
  }

  /// True where `ram_save` works (host tensors, not a pipeline's stages).
  [[nodiscard]] virtual bool keeps_ram_tier() const { return false; }
  /// Keeps the parameters and `opt`'s state as the state after `step` in the RAM tier `ro`
  /// (train/ram_tier.hpp): a copy training waits for, the rest in the background. Every rank
  /// calls it after the same steps.
  virtual void ram_save(std::size_t step, const nlohmann::json& meta, Optimizer& opt,
                        const ram_options& ro) {
    (void)step, (void)meta, (void)opt, (void)ro;
    throw no_checkpoints();
  }
  /// Sets the RAM tier `ro` up before the first step (its slot files made and touched), so the
  /// first saves cost what the others do. Collective.
  virtual void ram_start(Optimizer& opt, const ram_options& ro) {
    (void)opt, (void)ro;
    throw no_checkpoints();
  }
  /// Before the state changes (the update): the RAM tier's last save copied, its peer copies
  /// moved along.
  virtual void ram_poll() {}
  /// Waits for the RAM tier's copies and records; what the tier cost this rank.
  [[nodiscard]] virtual ram_stats ram_finish() { return {}; }

protected:
  [[nodiscard]] config_error no_checkpoints() const {
    return config_error("checkpoints on device " + device(),
                        "are saved and loaded from host memory only, for now",
                        "train on the host (--device host) to save or resume");
  }
};

/// One rank of a distributed run: an engine with the run's own settings and its trace
/// (train/distributed_engine.hpp implements it over any communicator and backend).
template <std::floating_point T, class Optimizer>
class rank_engine : public engine<T, Optimizer> {
public:
  virtual void set_slowdown(double s) = 0; ///< an emulated slower device
  virtual void set_bucket_bytes(std::size_t bytes) = 0;
  [[nodiscard]] virtual std::size_t gradient_bytes() const = 0;
  [[nodiscard]] virtual std::size_t gradient_bytes_unshared() const = 0;
  /// Seconds this rank computed since the last call (exec/distributed.hpp).
  [[nodiscard]] virtual double take_compute_seconds() = 0;
  /// Continues under plan `p` (the run's program at new ratios, or another plan of the same
  /// graph): re-lowers, and moves the parameters and `opt`'s state to the new pieces (exec/
  /// reshard.hpp). Collective. Throws `config_error` where the engine cannot (a device engine,
  /// an optimizer whose state it cannot see).
  virtual void rebalance(const synth::plan& p, Optimizer& opt) = 0;
  /// Records an event of the run on the trace's step track (e.g. a re-balance).
  virtual void trace_event(std::string name, std::chrono::steady_clock::time_point begin,
                           std::chrono::steady_clock::time_point end, nlohmann::json args) = 0;
};

/// The engine of one process whose tensors live in backend `B`.
template <std::floating_point T, class Optimizer, backend B>
class backend_engine final : public engine<T, Optimizer> {
public:
  backend_engine(const graph::graph& g, std::uint64_t seed, B be = {}, std::string device = {})
      : ex_(g, seed, {}, std::move(be)),
        device_(device.empty() ? std::string(ex_.backend().name()) : std::move(device)) {
    // Intermediate gradients share memory across the backward, as on each rank of a plan: a
    // smaller working set (BERT-small's step ~3 % faster), and a reshape's input gradient takes
    // the reshape's memory instead of a copy. Only parameters' gradients outlive the backward.
    ex_.reuse_gradient_buffers();
  }
  void set_input(std::string_view n, std::span<const T> v) override { ex_.set_input(n, v); }
  void set_input(std::string_view n, std::span<const std::int64_t> v) override {
    ex_.set_input(n, v);
  }
  using batch_sink<T>::set_input;
  executor<T, host_backend>* host_executor() override { return detail::host_executor_of(ex_); }
  std::string device() const override { return device_; }
  void set_profiling(bool on) override { ex_.set_profiling(on); }
  std::vector<profile_entry> profile() const override { return ex_.profile(); }
  std::optional<memory_stats> memory() const override { return detail::memory_of(ex_.backend()); }
  void set_step(std::size_t s) override { ex_.set_step(s); }
  void set_training(bool on) override { ex_.set_training(on); }
  void set_precision(exec::precision p) override { ex_.set_precision(p); }
  void set_loss_scale(double scale) override { ex_.set_loss_scale(scale); }
  std::size_t recompute() override { return ex_.recompute(scope_segments(ex_.graph())); }
  double forward() override { return static_cast<double>(ex_.forward()); }
  void backward() override { ex_.backward(); }
  void accumulate(std::size_t micro, std::size_t count) override { acc_.add(ex_, micro, count); }
  double grad_norm() override { return std::sqrt(grad_norm_squared(ex_)); }
  void step(Optimizer& opt, double scale) override { step_scaled(opt, ex_, scale); }
  std::vector<T> whole(graph::node_id id) override { return ex_.value_to_host(id); }
  double slowest(double seconds) override { return seconds; }
  void barrier() override {}
  bool root() const override { return true; }
  [[nodiscard]] executor<T, B>& local() noexcept { return ex_; }
  std::filesystem::path save_state(const std::filesystem::path& root, std::size_t step,
                                   const nlohmann::json& meta, Optimizer& opt,
                                   const checkpoint_options& co) override {
    if constexpr (std::same_as<B, host_backend>) {
      solo_communicator solo;
      const auto t = training_tensors<T>(ex_.graph(), nullptr, ex_, opt);
      return save_training<T>(solo, root, step, std::span<const training_tensor<T>>(t), meta, co);
    } else {
      return engine<T, Optimizer>::save_state(root, step, meta, opt, co);
    }
  }
  bool keeps_ram_tier() const override { return std::same_as<B, host_backend>; }
  void ram_save(std::size_t step, const nlohmann::json& meta, Optimizer& opt,
                const ram_options& ro) override {
    if constexpr (std::same_as<B, host_backend>) {
      const auto t = training_tensors<T>(ex_.graph(), nullptr, ex_, opt);
      ram_.save(solo_, ro, step, std::span<const training_tensor<T>>(t), meta);
    } else {
      engine<T, Optimizer>::ram_save(step, meta, opt, ro);
    }
  }
  void ram_start(Optimizer& opt, const ram_options& ro) override {
    if constexpr (std::same_as<B, host_backend>) {
      const auto t = training_tensors<T>(ex_.graph(), nullptr, ex_, opt);
      ram_.start(solo_, ro, std::span<const training_tensor<T>>(t));
    } else {
      engine<T, Optimizer>::ram_start(opt, ro);
    }
  }
  void ram_poll() override { ram_.poll(); }
  ram_stats ram_finish() override { return ram_.finish(); }
  checkpoint_info load_state(const std::filesystem::path& path, Optimizer& opt,
                             bool parameters_only) override {
    if constexpr (std::same_as<B, host_backend>) {
      solo_communicator solo;
      const auto t = training_tensors<T>(ex_.graph(), nullptr, ex_, opt);
      return load_training<T>(solo, path, std::span<const training_tensor<T>>(t), parameters_only);
    } else {
      return engine<T, Optimizer>::load_state(path, opt, parameters_only);
    }
  }

private:
  executor<T, B> ex_;
  std::string device_;
  gradient_accumulator<T, B> acc_;
  solo_communicator solo_;
  ram_keeper<T, solo_communicator> ram_;
};

/// A device engine provided by a separately compiled backend, selected by `name`
/// (`train_options::device`).
template <std::floating_point T, class Optimizer>
struct device_engine_entry {
  std::string name;
  /// How many devices this process can use; 0 with the reason in `why` when none.
  std::function<int(std::string& why)> probe;
  /// The engine of one process on the first usable device (throws device_error).
  std::function<std::unique_ptr<engine<T, Optimizer>>(const graph::graph&, std::uint64_t seed)>
      make;
  /// The engine of this rank of a distributed run on its device (collective over the MPI
  /// communicator; picks the rank's device itself). Empty: the engine trains one process only.
  std::function<std::unique_ptr<rank_engine<T, Optimizer>>(const graph::graph&, const synth::plan&,
                                                           mpi_communicator&, std::uint64_t seed)>
      make_distributed;
  /// Measures a graph's compute on this process's device for the cost model (`--calibrate`,
  /// train/profile.hpp's `measure_compute` on the engine's backend). Empty: the host's is used.
  std::function<synth::compute_profile(const graph::graph&, double speed, const profile_options&)>
      measure;
};

/// The device engines linked into this program (function-local, so one per program).
template <std::floating_point T, class Optimizer>
[[nodiscard]] std::vector<device_engine_entry<T, Optimizer>>& device_engines() {
  static std::vector<device_engine_entry<T, Optimizer>> entries;
  return entries;
}

/// The registered engine named `name`, or nullptr.
template <std::floating_point T, class Optimizer>
[[nodiscard]] const device_engine_entry<T, Optimizer>* find_device_engine(std::string_view name) {
  for (const auto& e : device_engines<T, Optimizer>())
    if (e.name == name)
      return &e;
  return nullptr;
}

/// Registers a device engine at static initialization: `static const register_device_engine<
/// float, adam> r{{"cuda", probe, make}};` in the backend's translation unit.
template <std::floating_point T, class Optimizer>
struct register_device_engine {
  explicit register_device_engine(device_engine_entry<T, Optimizer> e) {
    if (find_device_engine<T, Optimizer>(e.name) == nullptr)
      device_engines<T, Optimizer>().push_back(std::move(e));
  }
};

/// The engine of one process on `d`: "host"; a registered device engine ("cuda" where
/// hspmd::cuda is linked); or "auto", the first registered engine that finds a device, else the
/// host. Throws `config_error` naming the device and the fix when there is none.
template <std::floating_point T, class Optimizer>
[[nodiscard]] std::unique_ptr<engine<T, Optimizer>>
make_engine(const graph::graph& g, const std::string& d, std::uint64_t seed) {
  if (d == "auto")
    for (const auto& e : device_engines<T, Optimizer>()) {
      std::string why;
      if (e.probe(why) > 0)
        return e.make(g, seed);
    }
  if (d == "auto" || d == "host")
    return std::make_unique<backend_engine<T, Optimizer, host_backend>>(g, seed);
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
  return e->make(g, seed);
}

} // namespace hspmd::train
