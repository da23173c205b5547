#pragma once
// Runs a plan on every rank of a communicator: the rank's local graph (program/lower.hpp) through
// the single-process executor's kernels, with every transfer of the plan as a collective and in
// the backward each transfer's dual (exec/transfers.hpp); replicated parameters' gradients are
// all-reduced in buckets, or by SFB where the plan says so (the rank's step program, run
// instruction by instruction by exec/step_interpreter.hpp).
//
// Gradients follow the dual placements: the gradient of a replicated version is a partial sum
// over ranks, of a partial version complete on every rank, of a split version the rank's piece.
// Local kernels keep that invariant by themselves (backward is linear in the output gradient).
//
// Tensors live in backend `B` (the host by default): with a device backend the transfers,
// buckets and reductions run on its buffers, moved by the communicator directly (NCCL) or
// staged through the host (MPI), see exec/comm_span.hpp. A gradient bucket on a device
// communicator that takes the backend's stream (NCCL with the CUDA backend) waits for its
// packing kernels by an event and all-reduces on the communication stream while the compute
// stream runs the rest of the backward pass.
//
//     exec::distributed_executor<float, mpi_communicator> dx(g, plan, comm, seed);
//     dx.set_input("x", global_batch);      // every rank passes the whole batch; keeps its piece
//     const float loss = dx.forward();      // the global loss on every rank
//     dx.backward();                        // local gradients, parameter gradients synchronized
//     dx.clip_grad_norm(1.0);               // by the global norm
//     opt.step(dx.local());                 // optimizers update the rank's pieces

#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/debug.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/agreement.hpp>
#include <hspmd/exec/comm_span.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/gradient_sync.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/step_interpreter.hpp>
#include <hspmd/exec/trace.hpp>
#include <hspmd/exec/transfers.hpp>
#include <hspmd/program/layout.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/program/step.hpp>
#include <hspmd/synth/cost.hpp>
#include <hspmd/synth/plan.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// One rank's share of a distributed training step (see the file comment).
template <std::floating_point T, class Comm, backend B = host_backend>
requires communicator<Comm, T> && communicator<Comm, std::int64_t> && communicator<Comm, double> &&
    communicator<detail::control_t<Comm>, std::uint64_t> &&
    communicator<detail::control_t<Comm>, std::int64_t> && communicator < detail::control_t<Comm>,
char > class distributed_executor : public step_interpreter<T, Comm, B> {
  using base = step_interpreter<T, Comm, B>;

public:
  /// Checks that every rank holds the same model, cluster, ratios and plan (collective; any
  /// difference throws `plan_error` on every rank naming it), lowers `p` for this rank and
  /// materializes the rank's pieces of the parameters.
  distributed_executor(const graph::graph& g, const synth::plan& p, Comm& comm,
                       std::uint64_t seed = 0, B backend = {})
      : base(g, p, comm, seed, std::move(backend)) {}
  distributed_executor(const distributed_executor&) = delete;
  distributed_executor& operator=(const distributed_executor&) = delete;

  /// Activation recomputation (exec::executor::recompute) over the model's blocks
  /// (exec::scope_segments of the rank's graph): a block's inner values are not kept, and the
  /// backward runs the block's forward again, its transfers included (collectives: every rank
  /// replays the same block at the same point) and the FSDP copies it reads gathered again. Call
  /// on every rank, before the first step. Returns the bytes of the shared buffer.
  std::size_t recompute(std::string_view prefix = "layers.") {
    program::step_options o = options_;
    o.recompute = true;
    o.block_prefix = std::string(prefix);
    program::step_program sp = program::build(prog_, g_, o);
    const program::recompute_facts& f = sp.recompute;
    const std::size_t bytes =
        ex_.recompute(scope_segments(prog_.local, prefix), f.refilled, f.extra_users, f.keep);
    // The executor placed the memory of the values the program replays: the same function of
    // the same graph and facts, so the same nodes.
    const auto& placed = ex_.recompute_segments();
    for (std::size_t k = 0; k < placed.size(); ++k)
      if (k >= sp.segments.size() || placed[k].internal != sp.segments[k].internal)
        throw plan_error("distributed executor",
                         "recomputation segment " + std::to_string(k) +
                             " replays other nodes than the executor placed",
                         "report this: the step program and the executor disagree");
    options_ = o;
    sp_ = std::move(sp);
    return bytes;
  }

  /// Bytes of the buffer that the FSDP-gathered parameter copies share (0 without any): each
  /// copy lives from its all-gather to its last reader, and the backward gathers it again
  /// before that reader's backward (see `share_gathered_parameters`).
  [[nodiscard]] std::size_t gathered_parameter_bytes() const noexcept { return gathered_bytes_; }
  /// The local nodes holding FSDP-gathered parameter copies.
  [[nodiscard]] std::size_t gathered_parameter_copies() const noexcept {
    return sp_.gathered.size();
  }

  /// Bytes of gradient storage this rank holds: the parameters' gradients and the shared
  /// buffers of the intermediate ones (exec::executor::reuse_gradient_buffers).
  [[nodiscard]] std::size_t gradient_bytes() const noexcept { return gradient_bytes_; }
  /// The same if every version had a gradient buffer of its own.
  [[nodiscard]] std::size_t gradient_bytes_unshared() const {
    std::size_t n = 0;
    for (const graph::node& v : prog_.local.nodes())
      if (v.type != dtype::i64)
        n += v.out.size() * sizeof(T);
    return n;
  }

  /// The rank's executor (local graph, pieces of values and gradients); optimizers step it.
  [[nodiscard]] executor<T, B>& local() noexcept { return ex_; }
  [[nodiscard]] const executor<T, B>& local() const noexcept { return ex_; }
  [[nodiscard]] const program::local_program& program() const noexcept { return prog_; }
  [[nodiscard]] Comm& communicator() const noexcept { return *comm_; }
  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }

  void set_step(std::uint64_t step) noexcept {
    step_ = step;
    ex_.set_step(step);
  }
  void set_training(bool on) noexcept { ex_.set_training(on); }
  /// Emulation of a slower device: every local compute takes `s` times as long (busy wait).
  void set_slowdown(double s) noexcept { device_.set_slowdown(s); }
  [[nodiscard]] double slowdown() const noexcept { return device_.slowdown(); }
  [[nodiscard]] std::size_t bucket_bytes() const noexcept { return options_.bucket_bytes; }
  /// Seconds this rank spent computing (the local graph's kernels and the optimizer, an
  /// emulated slowdown included) since the last call; what re-balancing compares with the
  /// plan's prediction (train/rebalance.hpp).
  [[nodiscard]] double take_compute_seconds() noexcept { return device_.take_compute_seconds(); }
  /// Bytes of gradients all-reduced together (the same on every rank; default
  /// `gradient_bucket_bytes`). Smaller buckets start earlier in the backward and overlap more of
  /// it; each pays one latency.
  void set_bucket_bytes(std::size_t bytes) {
    options_.bucket_bytes = std::max<std::size_t>(bytes, sizeof(T));
    sp_ = program::build(prog_, g_, options_);
    sync_.plan(sp_);
  }
  /// The gradient buckets: for each, its parameters' local node ids, in the order they are
  /// started (the first is ready earliest in the backward).
  [[nodiscard]] std::vector<std::vector<graph::node_id>> gradient_buckets() const {
    std::vector<std::vector<graph::node_id>> out;
    for (const program::gradient_bucket& b : sp_.buckets)
      out.push_back(b.params);
    return out;
  }

  /// Feeds input `name` from the whole (global) batch; the rank keeps its piece. With
  /// HSPMD_DEBUG=detail the ranks first compare a hash of the batch (collective) and throw
  /// `plan_error` on every rank, naming the input, the step and the first rank that differs.
  void set_input(std::string_view name, std::span<const T> whole) { feed(name, whole); }
  void set_input(std::string_view name, std::span<const std::int64_t> whole) { feed(name, whole); }
  /// Input `name` from a buffer of its whole size of which this rank filled only the box its
  /// versions load (a pipeline's boundary value, exec/pipeline_transfers.hpp): read there only,
  /// and not checked against the other ranks' (theirs differ outside their boxes).
  void set_received_input(std::string_view name, std::span<const T> whole) {
    feed(name, whole, false);
  }

  /// Forward on every rank (the step program's forward section); returns the global loss (the
  /// same on every rank).
  T forward() {
    run(program::section::forward);
    return loss_;
  }

  /// Backward on every rank (the program's backward section), then the parameters' gradients
  /// are synchronized: afterwards each rank holds the complete gradient of its piece of every
  /// parameter.
  ///
  /// A bucket of replicated parameters' gradients starts its all-reduce as soon as the backward
  /// has produced all of them (non-blocking where the communicator has one), and the backward
  /// goes on; between instructions (and while an emulated slow device waits) the rank drives
  /// the collectives in flight; at the end it waits for them.
  void backward() {
    ex_.begin_backward();
    run(program::section::backward);
  }
  /// Backward without the parameters' gradient synchronization (no post, SFB or wait): with
  /// `local().set_accumulate_parameter_gradients(true)` a step's micro-batches before its last
  /// add into the local gradients, the last one's `backward` synchronizes the sums
  /// (exec/pipeline.hpp). Refused under SFB (its gradients come from one backward's factors).
  void backward_accumulating() {
    if (!sp_.sfb.empty())
      throw config_error("distributed executor", "gradient accumulation under SFB",
                         "plan the stage without SFB");
    ex_.begin_backward();
    run(program::section::backward, false);
  }

  /// Splits the backward into its input- and weight-gradient parts (a zero-bubble pipeline's
  /// stage, exec/pipeline.hpp; executor_memory::split_backward): a value is weight-side when it
  /// comes from parameters alone -- computed from them or moved from a weight-side value. Then
  /// `backward_inputs` and `backward_weights` replace `backward`. With gradient accumulation;
  /// refused under SFB, FSDP-gathered parameters and recomputation (each needs a whole
  /// backward). Call on every rank of the group, before the first step.
  void split_backward() {
    const auto refuse = [](const char* what, const char* fix) {
      throw config_error("distributed executor", std::string("a split backward under ") + what,
                         fix);
    };
    if (!sp_.sfb.empty())
      refuse("SFB", "plan the stage without SFB");
    if (!sp_.gathered.empty())
      refuse("FSDP", "plan the stage with whole or split parameters, not FSDP");
    if (options_.recompute)
      refuse("recomputation", "recompute or split the backward, not both");
    std::vector<bool> w(prog_.local.size(), false);
    for (graph::node_id i = 0; i < prog_.local.size(); ++i) {
      const graph::node& n = prog_.local[i];
      if (n.kind == graph::op::parameter) {
        w[i] = true;
      } else if (prog_.transfer_of[i]) {
        const auto& src = prog_.transfers[*prog_.transfer_of[i]].source;
        w[i] = src && w[*src];
      } else if (!n.inputs.empty()) {
        w[i] = std::ranges::all_of(n.inputs, [&](graph::node_id j) { return w[j]; });
      }
    }
    ex_.split_backward(std::move(w));
  }
  /// A split backward's first part: the activations' gradients (what the previous stage
  /// waits for), the parameters' left for `backward_weights`.
  void backward_inputs() {
    ex_.begin_backward(backward_part::inputs);
    this->run(program::section::backward, false, backward_part::inputs);
  }
  /// A split backward's second part: the weight-side gradients, added to the parameters'
  /// (`synchronize`: then the parameters' gradients are synchronized, as `backward` does).
  void backward_weights(bool synchronize) {
    ex_.begin_backward(backward_part::weights);
    this->run(program::section::backward, synchronize, backward_part::weights);
  }

  /// Runs `opt.step` on the rank's pieces (with the slowdown emulated like any compute);
  /// `grad_scale` is the clipping factor (`clip_scale` of the global norm), fused into the
  /// optimizer's pass where it takes one (exec/optim.hpp `step_scaled`).
  template <class Optimizer>
  void update(Optimizer& opt, double grad_scale = 1.0) {
    optimizer_step_ = [&] { step_scaled(opt, ex_, grad_scale); };
    execute(sp_.begin(program::section::optimizer) + 1);
    optimizer_step_ = nullptr;
  }

  /// Squared L2 norm of the whole gradient (every parameter element counted once).
  [[nodiscard]] double grad_norm_squared() {
    double s = 0.0;
    for (graph::node_id id : prog_.local.parameters()) {
      if (!prog_.where[id].is_split() && comm_->rank() != 0)
        continue; // replicated: rank 0 counts it
      s += sum_of_squares_on(ex_.backend(), std::span<const T>(ex_.grad(id)));
    }
    norm_squared_ = s;
    execute(sp_.begin(program::section::optimizer));
    return norm_squared_;
  }
  /// Clips the gradients to global norm `max_norm`; returns the norm before clipping.
  double clip_grad_norm(double max_norm) {
    return exec::clip_grad_norm(ex_, max_norm, grad_norm_squared());
  }

  /// The rank's step program (program/step.hpp): what `forward`, `backward`,
  /// `grad_norm_squared` and `update` run, in order.
  [[nodiscard]] const program::step_program& step_program() const noexcept { return sp_; }
  /// The whole value of parameter (or any tensor the rank holds a version of) `name`, on every
  /// rank (collective).
  [[nodiscard]] std::vector<T> gather(std::string_view name) {
    const auto gid = g_.find(name);
    if (!gid)
      throw plan_error("distributed executor", "no tensor named \"" + std::string(name) + "\"",
                       "use the graph's node names");
    for (graph::node_id i = 0; i < prog_.local.size(); ++i)
      if (prog_.global[i] == *gid && !prog_.where[i].is_partial())
        return assemble(i);
    throw plan_error("distributed executor",
                     "the plan keeps no whole or split version of " + std::string(name),
                     "gather a parameter or a tensor the plan does not leave partial");
  }

  /// The whole gradient of local version `id` on every rank of this communicator (collective);
  /// with `set_gradient_piece`, what a second level (exec/hierarchical.hpp) reduces across nodes
  /// when shards do not line up.
  [[nodiscard]] std::vector<T> gradient_whole(graph::node_id id) {
    static_assert(host_memory_v<B>, "whole gradients are assembled in host memory");
    return moves_.assemble(id, std::span<const T>(ex_.grad(id)));
  }
  /// Adds this rank's piece of local version `id`'s gradient into `whole` (its whole size).
  void add_gradient_into(graph::node_id id, std::span<T> whole) {
    static_assert(host_memory_v<B>, "whole gradients are assembled in host memory");
    moves_.piece_of(static_cast<const T*>(whole.data()), id, ex_.grad(id).data(), true,
                    whole.data());
  }
  /// Sets this rank's piece of local version `id`'s gradient from the whole `whole`.
  void set_gradient_piece(graph::node_id id, std::span<const T> whole) {
    static_assert(host_memory_v<B>, "whole gradients are cut in host memory");
    moves_.piece_of(whole.data(), id, ex_.grad(id).data(), false);
  }

  /// Starts recording a trace on every rank (collective: the ranks start their clocks together
  /// after a barrier). Records until `collect_trace`.
  void start_trace() {
    control_->barrier();
    trace_.start();
  }
  /// The rank's recorder (drivers add their own spans, e.g. steps).
  [[nodiscard]] trace_recorder& trace() noexcept { return trace_; }
  /// Collective: gathers every rank's events; rank 0 returns the whole trace (see
  /// exec/trace.hpp), the other ranks an empty object. `devices` names each rank's device.
  [[nodiscard]] nlohmann::json collect_trace(const std::vector<std::string>& devices = {}) {
    return gather_trace(*control_, trace_, devices);
  }

private:
  using base::assemble;
  using base::check_inputs_;
  using base::comm_;
  using base::control_;
  using base::device_;
  using base::ex_;
  using base::execute;
  using base::feed;
  using base::g_;
  using base::gathered_bytes_;
  using base::gradient_bytes_;
  using base::loss_;
  using base::moves_;
  using base::norm_squared_;
  using base::optimizer_step_;
  using base::options_;
  using base::prog_;
  using base::run;
  using base::sp_;
  using base::step_;
  using base::sync_;
  using base::trace_;
};

} // namespace hspmd::exec
