#pragma once
// Runs a plan on every rank of a communicator: the rank's local graph (exec/lower.hpp) through
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
#include <hspmd/comm/sfb.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/exec/agreement.hpp>
#include <hspmd/exec/comm_span.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/layout.hpp>
#include <hspmd/exec/lower.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/trace.hpp>
#include <hspmd/exec/transfers.hpp>
#include <hspmd/synth/cost.hpp>
#include <hspmd/synth/plan.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::exec {

namespace detail {
// True when communicator C starts an all-reduce ordered after backend B's queued work on the
// device (`start_all_reduce(data, op, be.stream())`: an event, no host wait), so a bucket goes
// out while the backend's stream runs the rest of the backward pass.
template <class C, class T, class B>
inline constexpr bool stream_ordered_v = requires(C& c, std::span<T> b, B& be) {
  c.start_all_reduce(b, reduce_op::sum, be.stream());
};

// The request of a communicator's non-blocking all-reduce (stream-ordered where it has that
// form), or `none` when it has none (then the buckets are all-reduced blocking, each as soon as
// it is ready).
struct no_request {};
template <class C, class T, class B>
struct request_of {
  using type = no_request;
  static constexpr bool nonblocking = false;
};
template <class C, class T, class B>
requires stream_ordered_v<C, T, B>
struct request_of<C, T, B> {
  using type = decltype(std::declval<C&>().start_all_reduce(
      std::declval<std::span<T>>(), reduce_op::sum, std::declval<B&>().stream()));
  static constexpr bool nonblocking = true;
};
template <class C, class T, class B>
requires(!stream_ordered_v<C, T, B> && requires(C & c, std::span<T> b) {
  c.start_all_reduce(b, reduce_op::sum);
}) struct request_of<C, T, B> {
  using type =
      decltype(std::declval<C&>().start_all_reduce(std::declval<std::span<T>>(), reduce_op::sum));
  static constexpr bool nonblocking = true;
};

// The communicator of host-memory control traffic (plan agreement, input checks, traces): a
// device communicator's bootstrap (NCCL's MPI communicator), else the communicator itself.
template <class C>
auto& control_of(C& c) {
  if constexpr (requires { c.bootstrap(); })
    return c.bootstrap();
  else
    return c;
}
template <class C>
using control_t = std::remove_reference_t<decltype(control_of(std::declval<C&>()))>;
} // namespace detail

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
      if (computing_)
        emulate_since(*computing_);
      comm_span<T, Comm, B> s(ex_.backend(), v, true);
      comm_->all_reduce(s.get(), max ? reduce_op::max : reduce_op::sum);
      s.written();
      if (computing_)
        computing_ = std::chrono::steady_clock::now();
    });
    // Gradient buffers of intermediate versions are shared across the backward; SFB reads its
    // layer's output gradient after the backward, so that one keeps its own.
    std::vector<graph::node_id> keep;
    std::vector<std::pair<graph::node_id, graph::node_id>> duals;
    std::vector<graph::node_id> storing; // whose dual can store the gradient instead of adding
    for (const lowered_transfer& t : prog_.transfers) {
      if (t.source)
        duals.emplace_back(*t.source, t.target);
      if (t.source && transfer_runner<T, Comm, B>::dual_can_store(t.what.kind))
        storing.push_back(*t.source);
      if (g_[t.what.tensor].kind == graph::op::parameter) // a master weight's copy: float
        ex_.keep_in_float(t.target);
      if (t.what.sfb)
        if (const auto user = sole_user(t.target))
          keep.push_back(*user);
    }
    {
      std::vector<graph::node_id> sources; // (a transfer reads its value whole)
      for (const auto& d : duals)
        sources.push_back(d.first);
      ex_.keep_element_order(sources);
    }
    gradient_bytes_ = ex_.reuse_gradient_buffers(keep, duals, storing);
    plan_gradient_sync();
    share_gathered_parameters();
  }
  distributed_executor(const distributed_executor&) = delete;
  distributed_executor& operator=(const distributed_executor&) = delete;

  /// Activation recomputation (exec::executor::recompute) over the model's blocks
  /// (exec::scope_segments of the rank's graph): a block's inner values are not kept, and the
  /// backward runs the block's forward again, its transfers included (collectives: every rank
  /// replays the same block at the same point) and the FSDP copies it reads gathered again. Call
  /// on every rank, before the first step. Returns the bytes of the shared buffer.
  std::size_t recompute(std::string_view prefix = "layers.") {
    const std::size_t n = prog_.local.size();
    std::vector<bool> moved(n, false); // made by a transfer, which a replay runs again
    for (const lowered_transfer& t : prog_.transfers)
      if (t.what.kind != synth::transfer_kind::load)
        moved[t.target] = true;
    // A transfer reads its source outside the graph's edges; SFB reads its layer's input after
    // the backward.
    std::vector<std::pair<graph::node_id, graph::node_id>> reads;
    for (const lowered_transfer& t : prog_.transfers)
      if (t.source)
        reads.emplace_back(*t.source, t.target);
    std::vector<graph::node_id> keep;
    for (graph::node_id w : sfb_params_)
      keep.push_back(prog_.local[*sole_user(w)].inputs[0]);
    const std::size_t bytes =
        ex_.recompute(scope_segments(prog_.local, prefix), moved, reads, keep);
    std::vector<bool> gathered(n, false);
    for (const auto& at : regather_at_)
      for (graph::node_id k : at)
        gathered[k] = true;
    // Per segment, what its replay runs in node order: its inner nodes, and the FSDP copies they
    // read gathered again where the forward gathered them (copies share memory only where their
    // lives do not overlap, so in forward order each is there while read); a copy gathered
    // before the segment goes first.
    replay_at_.assign(n, {});
    for (const auto& sg : ex_.recompute_segments()) {
      std::vector<bool> read(n, false);
      const auto note = [&](graph::node_id src) {
        while (!gathered[src] && prog_.local[src].kind == graph::op::reshape &&
               !prog_.local[src].inputs.empty())
          src = prog_.local[src].inputs[0]; // a view's value is its source's
        read[src] = read[src] || gathered[src];
      };
      for (graph::node_id j : sg.internal) {
        for (graph::node_id in : prog_.local[j].inputs)
          note(in);
        if (const auto t = prog_.transfer_of[j]; t && prog_.transfers[*t].source)
          note(*prog_.transfers[*t].source); // a version moved from a copy
      }
      std::vector<replay_item>& items = replay_at_[sg.last];
      for (graph::node_id k = 0; k < sg.first; ++k)
        if (read[k])
          items.push_back({k, true});
      std::size_t next = 0;
      for (graph::node_id k = sg.first; k <= sg.last; ++k) {
        if (read[k])
          items.push_back({k, true});
        if (next < sg.internal.size() && sg.internal[next] == k) {
          items.push_back({k, false});
          ++next;
        }
      }
    }
    return bytes;
  }

  /// Bytes of the buffer that the FSDP-gathered parameter copies share (0 without any): each
  /// copy lives from its all-gather to its last reader, and the backward gathers it again
  /// before that reader's backward (see `share_gathered_parameters`).
  [[nodiscard]] std::size_t gathered_parameter_bytes() const noexcept { return gathered_bytes_; }
  /// The local nodes holding FSDP-gathered parameter copies.
  [[nodiscard]] std::size_t gathered_parameter_copies() const noexcept { return gathered_; }

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
  [[nodiscard]] const local_program& program() const noexcept { return prog_; }

  void set_step(std::uint64_t step) noexcept {
    step_ = step;
    ex_.set_step(step);
  }
  void set_training(bool on) noexcept { ex_.set_training(on); }
  /// Emulation of a slower device: every local compute takes `s` times as long (busy wait).
  void set_slowdown(double s) noexcept { slowdown_ = std::max(1.0, s); }
  [[nodiscard]] double slowdown() const noexcept { return slowdown_; }
  [[nodiscard]] std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }
  /// Seconds this rank spent computing (the local graph's kernels and the optimizer, an
  /// emulated slowdown included) since the last call; what re-balancing compares with the
  /// plan's prediction (exec/rebalance.hpp).
  [[nodiscard]] double take_compute_seconds() noexcept {
    return std::exchange(compute_seconds_, 0.0);
  }
  /// Bytes of gradients all-reduced together (the same on every rank; default
  /// `gradient_bucket_bytes`). Smaller buckets start earlier in the backward and overlap more of
  /// it; each pays one latency.
  void set_bucket_bytes(std::size_t bytes) {
    bucket_bytes_ = std::max<std::size_t>(bytes, sizeof(T));
    plan_gradient_sync();
  }
  /// The gradient buckets: for each, its parameters' local node ids, in the order they are
  /// started (the first is ready earliest in the backward).
  [[nodiscard]] std::vector<std::vector<graph::node_id>> gradient_buckets() const {
    std::vector<std::vector<graph::node_id>> out;
    for (const gradient_bucket& b : buckets_)
      out.push_back(b.params);
    return out;
  }

  /// Feeds input `name` from the whole (global) batch; the rank keeps its piece. With
  /// HSPMD_DEBUG=detail the ranks first compare a hash of the batch (collective) and throw
  /// `plan_error` on every rank, naming the input, the step and the first rank that differs.
  void set_input(std::string_view name, std::span<const T> whole) { feed(name, whole); }
  void set_input(std::string_view name, std::span<const std::int64_t> whole) { feed(name, whole); }

  /// Forward on every rank; returns the global loss (the same on every rank).
  T forward() {
    for (graph::node_id i = 0; i < prog_.local.size(); ++i) {
      const auto t = prog_.transfer_of[i];
      if (t && prog_.transfers[*t].what.kind != synth::transfer_kind::load)
        traced_transfer(prog_.transfers[*t], false);
      else
        traced_compute(i, false);
    }
    const auto loss = *prog_.local.loss();
    T mine{};
    ex_.backend().copy_to_host(&mine, ex_.value(loss).data(), 1);
    T total{};
    trace_.span("all_reduce loss", trace_kind::communication, {{"bytes", sizeof(T)}},
                [&] { total = comm_->all_reduce(mine, reduce_op::sum); });
    return total;
  }

  /// Backward on every rank, then the parameters' gradients are synchronized: afterwards each
  /// rank holds the complete gradient of its piece of every parameter.
  ///
  /// A bucket of replicated parameters' gradients starts its all-reduce as soon as the backward
  /// has produced all of them (non-blocking where the communicator has one), and the backward
  /// goes on; between nodes (and while an emulated slow device waits) the rank drives the
  /// collectives in flight; at the end it waits for them.
  void backward() {
    ex_.begin_backward();
    std::size_t next = 0;
    for (graph::node_id i = static_cast<graph::node_id>(prog_.local.size()); i-- > 0;) {
      replay(i);
      for (graph::node_id k : regather_at_[i]) // a gathered parameter, about to be read again
        traced_transfer(prog_.transfers[*prog_.transfer_of[k]], false);
      const auto t = prog_.transfer_of[i];
      if (t && prog_.transfers[*t].what.kind != synth::transfer_kind::load) {
        ex_.enter_backward(i);
        traced_transfer(prog_.transfers[*t], true);
      } else
        traced_compute(i, true);
      for (; next < buckets_.size() && buckets_[next].ready_at >= i; ++next)
        start_bucket(next);
      progress();
    }
    for (; next < buckets_.size(); ++next)
      start_bucket(next);
    for (graph::node_id w : sfb_params_)
      trace_.span("sfb " + g_[prog_.global[w]].name, trace_kind::communication,
                  {{"bytes", ex_.grad(w).size() * sizeof(T)}}, [&] { sfb_gradient(w); });
    finish_buckets();
  }

  /// Runs `opt.step` on the rank's pieces (with the slowdown emulated like any compute);
  /// `grad_scale` is the clipping factor (`clip_scale` of the global norm), fused into the
  /// optimizer's pass where it takes one (exec/optim.hpp `step_scaled`).
  template <class Optimizer>
  void update(Optimizer& opt, double grad_scale = 1.0) {
    trace_.span("optimizer", trace_kind::compute, {},
                [&] { compute([&] { step_scaled(opt, ex_, grad_scale); }); });
  }

  /// Squared L2 norm of the whole gradient (every parameter element counted once).
  [[nodiscard]] double grad_norm_squared() {
    double s = 0.0;
    for (graph::node_id id : prog_.local.parameters()) {
      if (!prog_.where[id].is_split() && comm_->rank() != 0)
        continue; // replicated: rank 0 counts it
      s += sum_of_squares_on(ex_.backend(), std::span<const T>(ex_.grad(id)));
    }
    double total = 0.0;
    trace_.span("all_reduce gradient norm", trace_kind::communication, {{"bytes", sizeof(double)}},
                [&] { total = comm_->all_reduce(s, reduce_op::sum); });
    return total;
  }
  /// Clips the gradients to global norm `max_norm`; returns the norm before clipping.
  double clip_grad_norm(double max_norm) {
    return exec::clip_grad_norm(ex_, max_norm, grad_norm_squared());
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
    const auto me = control_->rank();
    const auto n = static_cast<std::size_t>(control_->size());
    const std::string mine = trace_
                                 .events_json(me, static_cast<std::size_t>(me) < devices.size()
                                                      ? devices[static_cast<std::size_t>(me)]
                                                      : "rank " + std::to_string(me))
                                 .dump();
    std::vector<std::uint64_t> sizes(n);
    const std::uint64_t my_size = mine.size();
    control_->all_gather_v(std::span<const std::uint64_t>(&my_size, 1),
                           std::span<std::uint64_t>(sizes), std::vector<std::size_t>(n, 1),
                           uneven_algorithm::native);
    std::vector<std::size_t> counts(sizes.begin(), sizes.end());
    std::vector<char> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    control_->all_gather_v(std::span<const char>(mine.data(), mine.size()), std::span<char>(all),
                           std::span<const std::size_t>(counts), uneven_algorithm::native);
    if (me != 0)
      return nlohmann::json::object();
    std::vector<nlohmann::json> ranks;
    std::size_t at = 0;
    for (std::size_t c : counts) {
      ranks.push_back(nlohmann::json::parse(all.begin() + static_cast<std::ptrdiff_t>(at),
                                            all.begin() + static_cast<std::ptrdiff_t>(at + c)));
      at += c;
    }
    return chrome_trace(ranks);
  }

private:
  // Compute of local node i (forward or backward), traced with its node and op.
  void traced_compute(graph::node_id i, bool backward) {
    const auto run = [&] {
      compute([&] {
        if (backward)
          ex_.backward_node(i);
        else
          ex_.forward_node(i);
      });
    };
    const graph::node& n = prog_.local[i];
    if (!trace_.on() || n.kind == graph::op::input || n.kind == graph::op::parameter) {
      run();
      return;
    }
    nlohmann::json args{{"op", std::string(graph::name(n.kind))},
                        {"pass", backward ? "backward" : "forward"},
                        {"slowdown", slowdown_}};
    if constexpr (host_memory_v<B>) {
      trace_.span(g_[prog_.global[i]].name, trace_kind::compute, args, run);
    } else {
      // A device's kernels run after the host queued them: the traced node waits for them
      // (events on the backend's stream), so the span is the device's work, its time in args.
      const auto begin = std::chrono::steady_clock::now();
      const double seconds = ex_.backend().timed(run);
      args["device_ms"] = seconds * 1e3;
      trace_.add(g_[prog_.global[i]].name, trace_kind::compute, begin,
                 std::chrono::steady_clock::now(), std::move(args));
    }
  }
  // A transfer or its dual, traced with its kind, tensor, bytes and algorithm.
  void traced_transfer(const lowered_transfer& t, bool backward) {
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
    using k = synth::transfer_kind;
    k kind = t.what.kind;
    if (backward) // the dual's kind
      kind = kind == k::all_gather       ? k::reduce_scatter
             : kind == k::reduce_scatter ? k::all_gather
                                         : kind;
    const graph::node& whole = g_[t.what.tensor];
    nlohmann::json args = {{"tensor", whole.name},
                           {"bytes", whole.out.size() * size_of(whole.type)},
                           {"placements", t.what.from.to_string() + " -> " + t.what.to.to_string()},
                           {"pass", backward ? "backward" : "forward"}};
    if (kind == k::all_gather || kind == k::reduce_scatter)
      args["algorithm"] = std::string(name(t.what.algorithm));
    trace_.span(std::string(synth::name(kind)) + " " + whole.name, trace_kind::communication, args,
                run);
  }

  // Runs f; with a slowdown s, waits (s - 1) times as long again. A kernel that communicates
  // (the vocabulary-parallel cross-entropy's row reductions) is slowed phase by phase: its
  // compute before each collective is stretched before the collective starts, and the time
  // spent waiting inside the collective is not stretched (once it was: rank 1's wait for the
  // faster rank inside the cross-entropy counted twice, ~1 ms a BERT-small step).
  template <class F>
  void compute(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    computing_ = start;
    f();
    emulate_since(*computing_);
    computing_.reset();
    compute_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // With a slowdown s: busy-waits (s - 1) times the time since `from` (an emulated slow device
  // computes; its host drives the collectives in flight meanwhile).
  void emulate_since(std::chrono::steady_clock::time_point from) {
    if (slowdown_ <= 1.0)
      return;
    const auto now = std::chrono::steady_clock::now();
    const auto until = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 (now - from) * (slowdown_ - 1.0));
    while (std::chrono::steady_clock::now() < until)
      progress();
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
    const auto gid = g_.find(name);
    if (!gid || g_[*gid].kind != graph::op::input)
      throw plan_error("distributed executor", "no input named \"" + std::string(name) + "\"",
                       "feed the inputs the model declared");
    if (whole.size() != g_[*gid].out.size())
      throw shape_error("input \"" + std::string(name) + "\"",
                        std::to_string(whole.size()) + " values for shape " +
                            g_[*gid].out.to_string(),
                        "pass the whole batch on every rank; each keeps its piece");
    if ((g_[*gid].type == dtype::i64) != std::is_same_v<E, std::int64_t>)
      throw plan_error("input \"" + std::string(name) + "\"",
                       std::is_same_v<E, std::int64_t> ? "is not an integer input"
                                                       : "is an integer input",
                       "feed ids as int64 and features as floating point");
    if (check_inputs_)
      check_same_input(name, std::as_bytes(whole));
    for (const lowered_transfer& t : prog_.transfers)
      if (t.what.kind == synth::transfer_kind::load && t.what.tensor == *gid) {
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

  // Every rank must feed the same whole batch: a rank whose data differs would silently train
  // on a mixture of batches. Checked at every feed: a hash at memory speed (10.7 GB/s here: 8 KiB
  // of tokens in 0.8 us, a 10 MiB image batch in 1 ms) and two collectives of one number.
  void check_same_input(std::string_view name, std::span<const std::byte> bytes) {
    const std::uint64_t mine = hash_bulk(bytes);
    std::uint64_t first = mine;
    control_->broadcast(std::span<std::uint64_t>(&first, 1), 0);
    const std::int64_t differs = control_->all_reduce(
        static_cast<std::int64_t>(mine == first ? control_->size() : control_->rank()),
        reduce_op::min);
    if (differs < control_->size())
      throw plan_error("input \"" + std::string(name) + "\" of step " + std::to_string(step_),
                       "rank " + std::to_string(differs) +
                           " fed a different whole batch than rank 0",
                       "feed every rank the same whole batch (same data order and seed); each "
                       "rank keeps its piece");
  }

  // FSDP: a parameter kept in shards and all-gathered for use is a working copy. Its value is
  // read from the gather to its last reader (views' readers included) in the forward, and from
  // that reader's backward to the gather's dual in the backward; in between it is dead. The
  // copies share one buffer where those lives do not overlap (exec::executor::
  // share_value_buffers), and the backward gathers each again before its last reader's
  // backward: one layer's parameters at a time instead of the whole model, for one more
  // all-gather per copy (the cost model prices both).
  void share_gathered_parameters() {
    const std::size_t n = prog_.local.size();
    regather_at_.assign(n, {});
    std::vector<std::pair<graph::node_id, graph::node_id>> lives;
    for (graph::node_id i = 0; i < n; ++i) {
      const auto t = prog_.transfer_of[i];
      if (!t || prog_.transfers[*t].what.kind != synth::transfer_kind::all_gather ||
          g_[prog_.global[i]].kind != graph::op::parameter || prog_.local[i].type == dtype::i64)
        continue;
      std::vector<bool> reads(n, false);
      reads[i] = true;
      for (graph::node_id v : ex_.views_of(i))
        reads[v] = true;
      graph::node_id last = i;
      for (graph::node_id j = i + 1; j < n; ++j) {
        for (graph::node_id in : prog_.local[j].inputs)
          if (reads[in])
            last = j;
        const auto tj = prog_.transfer_of[j]; // another version made from this copy
        if (tj && prog_.transfers[*tj].source && reads[*prog_.transfers[*tj].source])
          last = j;
      }
      lives.emplace_back(i, last);
      regather_at_[last].push_back(i);
    }
    gathered_ = lives.size();
    if (!lives.empty())
      gathered_bytes_ = ex_.share_value_buffers(lives);
  }

  // Before node i's backward: the forward of the recomputation segment ending at i again, its
  // transfers included, with the FSDP copies it reads gathered again (see `recompute`).
  void replay(graph::node_id i) {
    if (replay_at_.empty())
      return;
    for (const replay_item& r : replay_at_[i]) {
      const auto t = prog_.transfer_of[r.node];
      if (r.gather || (t && prog_.transfers[*t].what.kind != synth::transfer_kind::load))
        traced_transfer(prog_.transfers[*t], false);
      else
        traced_compute(r.node, false);
    }
  }

  void transfer_forward(const lowered_transfer& t) {
    if (prog_.local[t.target].type == dtype::i64)
      moves_.forward(t, ex_.ids(*t.source), ex_.ids(t.target));
    else
      moves_.forward(t, ex_.value(*t.source), ex_.value(t.target));
  }
  void transfer_backward(const lowered_transfer& t) {
    if (prog_.local[t.target].type != dtype::i64)
      moves_.backward(t, ex_.grad(*t.source), ex_.grad(t.target),
                      !ex_.gradient_stored_whole(*t.source));
  }

  // Replicated parameters' gradients are partial sums over the ranks: all-reduced in buckets, or
  // (where the plan chose SFB and the weight has one matmul user) by SFB after the backward.
  // Buckets are formed once, in the order the backward completes their gradients: a parameter's
  // gradient is final after the backward of the first node (in graph order) that reads it.
  void plan_gradient_sync() {
    buckets_.clear();
    sfb_params_.clear();
    if (comm_->size() == 1)
      return;
    const auto n = static_cast<graph::node_id>(prog_.local.size());
    std::vector<graph::node_id> first_use(n, n);
    for (graph::node_id i = 0; i < n; ++i) {
      for (graph::node_id in : prog_.local[i].inputs)
        first_use[in] = std::min(first_use[in], i);
      if (const auto t = prog_.transfer_of[i]; t && prog_.transfers[*t].source)
        first_use[*prog_.transfers[*t].source] =
            std::min(first_use[*prog_.transfers[*t].source], i);
    }
    std::vector<graph::node_id> params;
    for (const lowered_transfer& t : prog_.transfers) {
      if (t.what.kind != synth::transfer_kind::load ||
          g_[t.what.tensor].kind != graph::op::parameter || !t.what.to.is_replicated())
        continue;
      if (t.what.sfb && sfb_applies(t.target))
        sfb_params_.push_back(t.target);
      else
        params.push_back(t.target);
    }
    std::ranges::stable_sort(params, std::ranges::greater{},
                             [&](graph::node_id p) { return first_use[p]; });
    for (graph::node_id p : params) {
      const std::size_t bytes = ex_.grad(p).size() * sizeof(T);
      if (buckets_.empty() ||
          (buckets_.back().bytes > 0 && buckets_.back().bytes + bytes > bucket_bytes_))
        buckets_.emplace_back();
      gradient_bucket& b = buckets_.back();
      b.params.push_back(p);
      b.bytes += bytes;
      const graph::node_id ready = first_use[p] == n ? n - 1 : first_use[p];
      b.ready_at = b.params.size() == 1 ? ready : std::min(b.ready_at, ready);
    }
    for (gradient_bucket& b : buckets_) {
      b.flat = ex_.backend().template allocate<T>(b.bytes / sizeof(T));
      if constexpr (staged_comm)
        b.staged.assign(b.bytes / sizeof(T), T{});
    }
    requests_.resize(buckets_.size());
  }

  // Packs bucket k's gradients and starts their all-reduce.
  void start_bucket(std::size_t k) {
    gradient_bucket& b = buckets_[k];
    std::size_t at = 0;
    for (graph::node_id id : b.params) {
      const auto gr = ex_.grad(id);
      for_each_index(ex_.backend(), gr.size(),
                     copy_elements<T>{gr.data(), b.flat.data() + at, false});
      at += gr.size();
    }
    std::span<T> moved(b.flat.data(), b.flat.size());
    // A device communicator's stream reads the bucket after the packing kernels: ordered by an
    // event where it takes the backend's stream, else the backend finishes its queue first.
    if constexpr (!staged_comm && !host_memory_v<B> && !stream_ordered)
      ex_.backend().synchronize();
    if constexpr (staged_comm) {
      ex_.backend().copy_to_host(b.staged.data(), b.flat.data(), b.flat.size());
      moved = std::span<T>(b.staged);
    }
    b.started = std::chrono::steady_clock::now();
    b.done = false;
    if constexpr (stream_ordered) {
      requests_[k] = comm_->start_all_reduce(moved, reduce_op::sum, ex_.backend().stream());
      in_flight_ = true;
    } else if constexpr (detail::request_of<Comm, T, B>::nonblocking) {
      requests_[k] = comm_->start_all_reduce(moved, reduce_op::sum);
      in_flight_ = true;
    } else {
      trace_.span("all_reduce gradients", trace_kind::communication, bucket_args(k),
                  [&] { comm_->all_reduce(moved, reduce_op::sum); });
      b.done = true;
    }
  }

  // Drives the collectives in flight (MPI progresses only inside its calls); records each one
  // that completes.
  void progress() {
    if constexpr (detail::request_of<Comm, T, B>::nonblocking) {
      if (!in_flight_)
        return;
      bool any = false;
      for (std::size_t k = 0; k < buckets_.size(); ++k) {
        gradient_bucket& b = buckets_[k];
        if (b.done || requests_[k].done())
          continue;
        if (comm_->test(requests_[k])) {
          b.done = true;
          trace_in_flight(k);
        } else
          any = true;
      }
      in_flight_ = any;
    }
  }

  // Waits for every bucket and copies the sums back into the gradients.
  void finish_buckets() {
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      gradient_bucket& b = buckets_[k];
      if constexpr (detail::request_of<Comm, T, B>::nonblocking) {
        if (!b.done) {
          trace_.span("wait for gradients", trace_kind::communication, bucket_args(k),
                      [&] { comm_->wait(requests_[k]); });
          b.done = true;
          trace_in_flight(k);
        }
      }
      if constexpr (staged_comm)
        ex_.backend().copy_from_host(b.flat.data(), b.staged.data(), b.staged.size());
      std::size_t at = 0;
      for (graph::node_id id : b.params) {
        auto gr = ex_.grad(id);
        for_each_index(ex_.backend(), gr.size(),
                       copy_elements<T>{b.flat.data() + at, gr.data(), false});
        at += gr.size();
      }
    }
    in_flight_ = false;
  }

  // Records completed bucket k's all-reduce: from its start to when the host saw it complete;
  // a device communicator adds the seconds its stream spent on it (event timing).
  void trace_in_flight(std::size_t k) {
    if (!trace_.on())
      return;
    nlohmann::json args = bucket_args(k);
    if constexpr (requires { comm_->device_seconds(requests_[k]); })
      args["device_ms"] = comm_->device_seconds(requests_[k]) * 1e3;
    trace_.add("all_reduce gradients", trace_kind::in_flight, buckets_[k].started,
               std::chrono::steady_clock::now(), std::move(args));
  }

  [[nodiscard]] nlohmann::json bucket_args(std::size_t k) const {
    return {{"bytes", buckets_[k].bytes}, {"parameters", buckets_[k].params.size()}, {"bucket", k}};
  }

  // SFB for replicated weight `w` read by exactly one matmul / linear with row-split input:
  // all-gather the input rows and the output gradient, one local GEMM. False when the weight
  // has another use (the all-reduce then covers every contribution).
  // The only local node reading `w`, if exactly one does.
  [[nodiscard]] std::optional<graph::node_id> sole_user(graph::node_id w) const {
    std::optional<graph::node_id> user;
    for (graph::node_id i = 0; i < prog_.local.size(); ++i)
      for (graph::node_id in : prog_.local[i].inputs)
        if (in == w) {
          if (user)
            return std::nullopt;
          user = i;
        }
    return user;
  }

  // SFB applies to `w` (see above); otherwise its gradient is all-reduced.
  [[nodiscard]] bool sfb_applies(graph::node_id w) const {
    const std::optional<graph::node_id> user = sole_user(w);
    if (!user)
      return false;
    const graph::node& op = prog_.local[*user];
    if ((op.kind != graph::op::linear && op.kind != graph::op::matmul) || op.inputs[1] != w)
      return false;
    const node_layout& lx = prog_.layouts[op.inputs[0]];
    return lx.split && *lx.split + 1 < lx.global.size();
  }

  void sfb_gradient(graph::node_id w) {
    const graph::node& op = prog_.local[*sole_user(w)];
    const graph::node_id x = op.inputs[0];
    const node_layout& lx = prog_.layouts[x];
    const std::size_t k = lx.global.back();
    const std::size_t n = prog_.local[w].out.dims[1];
    std::vector<std::size_t> rows;
    for (std::size_t len : prog_.lengths[x]) {
      auto d = lx.global;
      d[*lx.split] = len;
      rows.push_back(detail::product(d) / std::max<std::size_t>(k, 1));
    }
    if constexpr (host_memory_v<B>) {
      sfb_weight_gradient(*comm_, std::span<const T>(ex_.value(x)),
                          std::span<const T>(ex_.grad(*sole_user(w))),
                          std::span<const std::size_t>(rows), k, n, ex_.grad(w));
    } else {
      // On the device: both factors gathered into backend buffers (directly or staged, like any
      // transfer), then the product as a functor, one weight element per index summing the rows
      // in global order -- the host loop's order, so every rank holds the same bits.
      B& be = ex_.backend();
      const auto [total, x_counts, dy_counts] =
          sfb_layout_of(std::span<const std::size_t>(rows), k, n);
      auto xs = be.template allocate<T>(total * k);
      auto dys = be.template allocate<T>(total * n);
      const auto gather = [&](std::span<const T> piece, T* whole, std::size_t size,
                              const std::vector<std::size_t>& counts) {
        comm_span<const T, Comm, B> in(be, piece, true);
        comm_span<T, Comm, B> out(be, std::span<T>(whole, size), false);
        comm_->all_gather_v(in.get(), out.get(), std::span<const std::size_t>(counts),
                            uneven_algorithm::automatic);
        out.written();
      };
      gather(std::span<const T>(ex_.value(x)), xs.data(), total * k, x_counts);
      gather(std::span<const T>(ex_.grad(*sole_user(w))), dys.data(), total * n, dy_counts);
      for_each_index(be, k * n,
                     sfb_outer_product<T>{xs.data(), dys.data(), ex_.grad(w).data(), total, k, n});
    }
  }

  // The whole tensor of local version `id` on every rank (collective).
  std::vector<T> assemble(graph::node_id id) {
    return moves_.assemble(id, std::span<const T>(ex_.value(id)));
  }

  const graph::graph& g_;
  Comm* comm_;
  detail::control_t<Comm>* control_;
  local_program prog_;
  // Device buffers over a communicator of host memory: buckets are all-reduced from host copies.
  static constexpr bool staged_comm = !comm_reads_backend_v<Comm, B>;
  // Buckets start on the communicator's stream after an event on the backend's (see above).
  static constexpr bool stream_ordered = detail::stream_ordered_v<Comm, T, B>;
  static_assert(!(stream_ordered && staged_comm),
                "a communicator that takes the backend's stream must read its buffers");

  executor<T, B> ex_;
  transfer_runner<T, Comm, B> moves_{prog_, *comm_, ex_.backend()};
  struct gradient_bucket {
    std::vector<graph::node_id> params; // local parameter versions, packed in this order
    std::size_t bytes = 0;
    typename B::template buffer<T> flat; // the bucket's buffer, reused every step
    std::vector<T> staged;               // its host copy when the communicator needs one
    graph::node_id ready_at{}; // every gradient is final once the backward has run this node
    std::chrono::steady_clock::time_point started;
    bool done = true;
  };
  std::size_t bucket_bytes_ = static_cast<std::size_t>(synth::gradient_bucket_bytes);
  std::vector<gradient_bucket> buckets_;
  std::vector<typename detail::request_of<Comm, T, B>::type> requests_;
  std::vector<graph::node_id> sfb_params_;
  bool in_flight_ = false;
  double slowdown_ = 1.0;
  std::optional<std::chrono::steady_clock::time_point> computing_; // a compute phase's start
  double compute_seconds_ = 0.0;
  std::uint64_t step_ = 0;
  bool check_inputs_ = true; // every rank feeds (SPMD), so every rank checks
  trace_recorder trace_;
  std::size_t gradient_bytes_ = 0;
  std::vector<std::vector<graph::node_id>> regather_at_; // gathered copies to make again there
  struct replay_item {
    graph::node_id node;
    bool gather; // an FSDP copy gathered again, else an inner node's forward
  };
  std::vector<std::vector<replay_item>> replay_at_; // a segment's replay, at its last node
  std::size_t gathered_ = 0;
  std::size_t gathered_bytes_ = 0;
};

} // namespace hspmd::exec
