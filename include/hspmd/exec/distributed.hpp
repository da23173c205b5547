#pragma once
// Runs a plan on every rank of a communicator: the rank's local graph (program/lower.hpp) through
// the single-process executor's kernels, with every transfer of the plan as a collective and in
// the backward each transfer's dual (exec/transfers.hpp); replicated parameters' gradients are
// all-reduced in buckets, or by SFB where the plan says so.
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
#include <hspmd/exec/emulation.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/gradient_sync.hpp>
#include <hspmd/exec/optim.hpp>
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
char > class distributed_executor {
public:
  /// Checks that every rank holds the same model, cluster, ratios and plan (collective; any
  /// difference throws `plan_error` on every rank naming it), lowers `p` for this rank and
  /// materializes the rank's pieces of the parameters.
  distributed_executor(const graph::graph& g, const synth::plan& p, Comm& comm,
                       std::uint64_t seed = 0, B backend = {})
      : g_(g), comm_(&comm), control_(&detail::control_of(comm)),
        prog_(lower_agreed(g, p, *control_)),
        ex_(prog_.local, seed, prog_.layouts, std::move(backend)) {
    ex_.set_row_reduce([this](std::span<T> v, bool max) {
      // (inside a kernel: an emulated slow device first computes what came before, slowly,
      // and then waits for the others only as long as a real one would)
      device_.pause([this] { sync_.progress(); });
      comm_span<T, Comm, B> s(ex_.backend(), v, true);
      comm_->all_reduce(s.get(), max ? reduce_op::max : reduce_op::sum);
      s.written();
      device_.resume();
    });
    // Gradient buffers of intermediate versions are shared across the backward; SFB reads its
    // layer's output gradient after the backward, so that one keeps its own.
    const transfer_buffers tb = transfer_buffers_of(g_, prog_);
    for (graph::node_id id : tb.float_copies)
      ex_.keep_in_float(id);
    ex_.keep_element_order(tb.read_whole);
    std::vector<graph::node_id> keep;
    for (graph::node_id w : sp_.sfb)
      keep.push_back(program::sfb_user(prog_, w));
    gradient_bytes_ = ex_.reuse_gradient_buffers(keep, tb.duals, tb.stored);
    sync_.plan(sp_);
    // FSDP: a parameter kept in shards and all-gathered for use is a working copy (the
    // program's `gathered`, each with its last reader). The copies share one buffer where their
    // lives do not overlap (exec::executor::share_value_buffers); the program gathers each again
    // before its last reader's backward: one layer's parameters at a time instead of the whole
    // model, for one more all-gather per copy (the cost model prices both).
    if (!sp_.gathered.empty())
      gathered_bytes_ = ex_.share_value_buffers(sp_.gathered);
  }
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
  /// The name of the program's instruction `k` (as the trace and the simulator name it).
  [[nodiscard]] std::string instruction_name(std::size_t k) const {
    return program::name(sp_.code.at(k), prog_, g_);
  }

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
  static program::step_options default_options() {
    program::step_options o;
    o.bucket_bytes = static_cast<std::size_t>(synth::gradient_bucket_bytes);
    o.element_bytes = sizeof(T);
    return o;
  }

  // Runs the program's section `s`, instruction by instruction.
  // (`synchronize` false: without the gradient buffers' post, SFB and wait)
  void run(program::section s, bool synchronize = true) {
    const std::size_t end = sp_.begin(s) + sp_.part(s).size();
    for (std::size_t k = sp_.begin(s); k < end; ++k) {
      const program::code op = sp_.code[k].op;
      if (synchronize ||
          (op != program::code::post && op != program::code::sfb && op != program::code::wait))
        execute(k);
    }
  }

  // Runs instruction k of the step program, traced under its name.
  void execute(std::size_t k) {
    using program::code;
    const program::instruction& in = sp_.code[k];
    switch (in.op) {
    case code::forward:
      traced_compute(k, in.node, "forward");
      break;
    case code::move:
    case code::regather:
      traced_transfer(k, in.node, false);
      break;
    case code::replay:
      if (program::is_moved(prog_, in.node))
        traced_transfer(k, in.node, false);
      else
        traced_compute(k, in.node, "replay");
      break;
    case code::backward:
      traced_compute(k, in.node, "backward");
      break;
    case code::move_back:
      ex_.enter_backward(in.node);
      traced_transfer(k, in.node, true);
      break;
    case code::loss: {
      T mine{};
      ex_.backend().copy_to_host(&mine, ex_.value(*prog_.local.loss()).data(), 1);
      traced(k, trace_kind::communication, {{"bytes", sizeof(T)}},
             [&] { loss_ = comm_->all_reduce(mine, reduce_op::sum); });
      break;
    }
    case code::post:
      traced(k, trace_kind::communication, sync_.args(in.bucket), [&] { sync_.start(in.bucket); });
      break;
    case code::sfb:
      traced(k, trace_kind::communication, {{"bytes", ex_.grad(in.node).size() * sizeof(T)}},
             [&] { sync_.sfb(prog_, in.node); });
      break;
    case code::wait:
      traced(k, trace_kind::communication, {{"bytes", sync_.bytes()}, {"buckets", sync_.size()}},
             [&] { sync_.finish(); });
      break;
    case code::norm:
      traced(k, trace_kind::communication, {{"bytes", sizeof(double)}},
             [&] { norm_squared_ = comm_->all_reduce(norm_squared_, reduce_op::sum); });
      break;
    case code::update:
      if (!optimizer_step_)
        throw plan_error("distributed executor", "the optimizer instruction has no optimizer",
                         "call update(optimizer)");
      traced(k, trace_kind::compute, {}, [&] { compute(optimizer_step_); });
      break;
    }
    if (k >= sp_.begin(program::section::backward) && k < sp_.begin(program::section::optimizer))
      sync_.progress();
  }

  // Runs f under instruction k's name (with its index in the args) when tracing.
  template <class F>
  void traced(std::size_t k, trace_kind kind, nlohmann::json args, F&& f) {
    if (!trace_.on()) {
      f();
      return;
    }
    args["instruction"] = k;
    trace_.span(instruction_name(k), kind, std::move(args), std::forward<F>(f));
  }

  // Compute of local node i (a forward, backward or replay), traced with its node and op.
  void traced_compute(std::size_t k, graph::node_id i, const char* pass) {
    const bool backward = pass[0] == 'b';
    const auto run = [&] {
      compute([&] {
        if (backward)
          ex_.backward_node(i);
        else
          ex_.forward_node(i);
      });
    };
    if (!trace_.on()) {
      run();
      return;
    }
    const graph::node& n = prog_.local[i];
    nlohmann::json args{{"op", std::string(graph::name(n.kind))},
                        {"pass", pass},
                        {"slowdown", device_.slowdown()},
                        {"instruction", k}};
    if constexpr (host_memory_v<B>) {
      trace_.span(instruction_name(k), trace_kind::compute, args, run);
    } else {
      // A device's kernels run after the host queued them: the traced node waits for them
      // (events on the backend's stream), so the span is the device's work, its time in args.
      const auto begin = std::chrono::steady_clock::now();
      const double seconds = ex_.backend().timed(run);
      args["device_ms"] = seconds * 1e3;
      trace_.add(instruction_name(k), trace_kind::compute, begin, std::chrono::steady_clock::now(),
                 std::move(args));
    }
  }
  // The transfer making local node i, or its dual, traced with its kind, tensor, bytes and
  // algorithm.
  void traced_transfer(std::size_t k, graph::node_id i, bool backward) {
    const program::lowered_transfer& t = prog_.transfers[*prog_.transfer_of[i]];
    const auto run = [&] {
      if (backward)
        transfer_backward(t);
      else
        transfer_forward(t);
    };
    if (!trace_.on()) {
      run();
      return;
    }
    nlohmann::json args = transfer_trace_args(g_, t, backward);
    args["instruction"] = k;
    trace_.span(instruction_name(k), trace_kind::communication, args, run);
  }

  // Runs f as compute (exec/emulation.hpp), the buckets in flight driven while it waits.
  template <class F>
  void compute(F&& f) {
    device_.compute(std::forward<F>(f), [this] { sync_.progress(); });
  }

  template <class E>
  std::span<E> data_of(graph::node_id id, bool grad) {
    if constexpr (std::is_same_v<E, std::int64_t>) {
      (void)grad;
      return ex_.ids(id);
    } else {
      return grad ? ex_.grad(id) : ex_.value(id);
    }
  }

  template <class E>
  void feed(std::string_view name, std::span<const E> whole) {
    const graph::node_id gid =
        checked_input(g_, name, whole.size(), std::is_same_v<E, std::int64_t>);
    if (check_inputs_)
      check_same_input(*control_, name, std::as_bytes(whole), step_);
    for (const program::lowered_transfer& t : prog_.transfers)
      if (t.what.kind == synth::transfer_kind::load && t.what.tensor == gid) {
        const std::span<E> to = data_of<E>(t.target, false);
        if constexpr (host_memory_v<B>) {
          moves_.piece_of(whole.data(), t.target, to.data(), false);
        } else { // the piece is cut on the host and copied once
          std::vector<E> piece(to.size());
          host_backend host;
          moves_.piece_of_on(host, whole.data(), t.target, piece.data(), false);
          ex_.backend().copy_from_host(to.data(), piece.data(), piece.size());
        }
      }
  }

  void transfer_forward(const program::lowered_transfer& t) {
    if (prog_.local[t.target].type == dtype::i64)
      moves_.forward(t, ex_.ids(*t.source), ex_.ids(t.target));
    else
      moves_.forward(t, ex_.value(*t.source), ex_.value(t.target));
  }
  void transfer_backward(const program::lowered_transfer& t) {
    if (prog_.local[t.target].type != dtype::i64)
      moves_.backward(t, ex_.grad(*t.source), ex_.grad(t.target),
                      !ex_.gradient_stored_whole(*t.source));
  }

  // The whole tensor of local version `id` on every rank (collective).
  std::vector<T> assemble(graph::node_id id) {
    return moves_.assemble(id, std::span<const T>(ex_.value(id)));
  }

  const graph::graph& g_;
  Comm* comm_;
  detail::control_t<Comm>* control_;
  program::local_program prog_;
  executor<T, B> ex_;
  transfer_runner<T, Comm, B> moves_{prog_, *comm_, ex_.backend()};
  program::step_options options_ = default_options();
  program::step_program sp_ = program::build(prog_, g_, options_);
  trace_recorder trace_;
  gradient_sync<T, Comm, B> sync_{*comm_, ex_, trace_};
  emulated_device device_; // the slowdown and the compute seconds
  std::uint64_t step_ = 0;
  bool check_inputs_ = true; // every rank feeds (SPMD), so every rank checks
  std::size_t gradient_bytes_ = 0;
  T loss_{};                             // the last forward's global loss
  double norm_squared_ = 0.0;            // the gradient norm's partial, then its sum
  std::function<void()> optimizer_step_; // what the update instruction runs
  std::size_t gathered_bytes_ = 0;
};

} // namespace hspmd::exec
