#pragma once
// Runs a plan on every rank of a communicator: the rank's local graph (exec/lower.hpp) through
// the single-process executor's kernels, with every transfer of the plan as a collective, and
// in the backward each transfer's dual:
//
//   forward                      backward (of the gradient)
//   slice      R -> S(d)         zero-padded piece added to the replicated version (a partial sum)
//   all-gather S(d) -> R         reduce-scatter
//   reduce-scatter P -> S(d)     all-gather
//   all-reduce P -> R            all-reduce
//   all-to-all S(i) -> S(j)      all-to-all S(j) -> S(i)
//   to-partial R -> P            the owner passes the gradient on
//   to-partial S(d) -> P         the rank's piece of the gradient
//   load (parameter, R)          gradient all-reduce (bucketed), or SFB when the plan says so
//
// Gradients follow the dual placements: the gradient of a replicated version is a partial sum
// over ranks, of a partial version complete on every rank, of a split version the rank's piece.
// Local kernels keep that invariant by themselves (backward is linear in the output gradient).
//
//     exec::distributed_executor<float, mpi_communicator> dx(g, plan, comm, seed);
//     dx.set_input("x", global_batch);      // every rank passes the whole batch; keeps its piece
//     const float loss = dx.forward();      // the global loss on every rank
//     dx.backward();                        // local gradients, parameter gradients synchronized
//     dx.clip_grad_norm(1.0);               // by the global norm
//     opt.step(dx.local());                 // optimizers update the rank's pieces

#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/sfb.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/kernels/box.hpp>
#include <hspmd/exec/layout.hpp>
#include <hspmd/exec/lower.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/trace.hpp>
#include <hspmd/synth/plan.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::exec {

namespace detail {

// Offsets of ranges of the given lengths.
[[nodiscard]] inline std::vector<std::size_t> starts_of(const std::vector<std::size_t>& lengths) {
  std::vector<std::size_t> s(lengths.size(), 0);
  for (std::size_t i = 1; i < lengths.size(); ++i)
    s[i] = s[i - 1] + lengths[i - 1];
  return s;
}

[[nodiscard]] inline std::size_t product(const std::vector<std::size_t>& d) {
  std::size_t n = 1;
  for (std::size_t x : d)
    n *= x;
  return n;
}

} // namespace detail

/// One rank's share of a distributed training step (see the file comment).
template <std::floating_point T, class Comm>
requires communicator<Comm, T> && communicator<Comm, std::int64_t> &&
    communicator<Comm, std::uint64_t>
class distributed_executor {
public:
  /// Checks that every rank holds the same model, cluster, ratios and plan (collective; any
  /// difference throws `plan_error` on every rank naming it), lowers `p` for this rank and
  /// materializes the rank's pieces of the parameters.
  distributed_executor(const graph::graph& g, const synth::plan& p, Comm& comm,
                       std::uint64_t seed = 0)
      : g_(g), comm_(&comm), prog_(agreed_lower(g, p, comm)),
        ex_(prog_.local, seed, prog_.layouts) {
    ex_.set_row_reduce([this](std::span<T> v, bool max) {
      comm_->all_reduce(v, max ? reduce_op::max : reduce_op::sum);
    });
    // Gradient buffers of intermediate versions are shared across the backward; SFB reads its
    // layer's output gradient after the backward, so that one keeps its own.
    std::vector<graph::node_id> keep;
    std::vector<std::pair<graph::node_id, graph::node_id>> duals;
    for (const lowered_transfer& t : prog_.transfers) {
      if (t.source)
        duals.emplace_back(*t.source, t.target);
      if (t.what.sfb)
        if (const auto user = sole_user(t.target))
          keep.push_back(*user);
    }
    gradient_bytes_ = ex_.reuse_gradient_buffers(keep, duals);
  }
  distributed_executor(const distributed_executor&) = delete;
  distributed_executor& operator=(const distributed_executor&) = delete;

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
  [[nodiscard]] executor<T>& local() noexcept { return ex_; }
  [[nodiscard]] const local_program& program() const noexcept { return prog_; }

  void set_step(std::uint64_t step) noexcept { ex_.set_step(step); }
  void set_training(bool on) noexcept { ex_.set_training(on); }
  /// Emulation of a slower device: every local compute takes `s` times as long (busy wait).
  void set_slowdown(double s) noexcept { slowdown_ = std::max(1.0, s); }

  /// Feeds input `name` from the whole (global) batch; the rank keeps its piece.
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
    T total{};
    trace_.span("all_reduce loss", trace_kind::communication, {{"bytes", sizeof(T)}},
                [&] { total = comm_->all_reduce(ex_.value(loss)[0], reduce_op::sum); });
    return total;
  }

  /// Backward on every rank, then the parameters' gradients are synchronized: afterwards each
  /// rank holds the complete gradient of its piece of every parameter.
  void backward() {
    ex_.begin_backward();
    for (graph::node_id i = static_cast<graph::node_id>(prog_.local.size()); i-- > 0;) {
      const auto t = prog_.transfer_of[i];
      if (t && prog_.transfers[*t].what.kind != synth::transfer_kind::load) {
        ex_.enter_backward(i);
        traced_transfer(prog_.transfers[*t], true);
      } else
        traced_compute(i, true);
    }
    synchronize_gradients();
  }

  /// Runs `opt.step` on the rank's pieces (with the slowdown emulated like any compute).
  template <class Optimizer>
  void update(Optimizer& opt) {
    trace_.span("optimizer", trace_kind::compute, {}, [&] { compute([&] { opt.step(ex_); }); });
  }

  /// Squared L2 norm of the whole gradient (every parameter element counted once).
  [[nodiscard]] double grad_norm_squared() {
    double s = 0.0;
    for (graph::node_id id : prog_.local.parameters()) {
      if (!prog_.where[id].is_split() && comm_->rank() != 0)
        continue; // replicated: rank 0 counts it
      for (T x : ex_.grad(id))
        s += static_cast<double>(x) * static_cast<double>(x);
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

  /// Starts recording a trace on every rank (collective: the ranks start their clocks together
  /// after a barrier). Records until `write_trace`.
  void start_trace() {
    comm_->barrier();
    trace_.start();
  }
  /// The rank's recorder (drivers add their own spans, e.g. steps).
  [[nodiscard]] trace_recorder& trace() noexcept { return trace_; }
  /// Collective: gathers every rank's events; rank 0 returns the whole trace (see
  /// exec/trace.hpp), the other ranks an empty object. `devices` names each rank's device.
  [[nodiscard]] nlohmann::json collect_trace(const std::vector<std::string>& devices = {}) {
    const auto me = comm_->rank();
    const auto n = static_cast<std::size_t>(comm_->size());
    const std::string mine = trace_
                                 .events_json(me, static_cast<std::size_t>(me) < devices.size()
                                                      ? devices[static_cast<std::size_t>(me)]
                                                      : "rank " + std::to_string(me))
                                 .dump();
    std::vector<std::uint64_t> sizes(n);
    const std::uint64_t my_size = mine.size();
    comm_->all_gather_v(std::span<const std::uint64_t>(&my_size, 1),
                        std::span<std::uint64_t>(sizes), std::vector<std::size_t>(n, 1),
                        uneven_algorithm::native);
    std::vector<std::size_t> counts(sizes.begin(), sizes.end());
    std::vector<char> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    comm_->all_gather_v(std::span<const char>(mine.data(), mine.size()), std::span<char>(all),
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
    trace_.span(g_[prog_.global[i]].name, trace_kind::compute,
                {{"op", std::string(graph::name(n.kind))},
                 {"pass", backward ? "backward" : "forward"},
                 {"slowdown", slowdown_}},
                run);
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

  // Before any training collective: every rank compares what it was given with every other.
  static void agree(const graph::graph& g, const synth::plan& p, Comm& comm) {
    std::string ratios;
    for (const auto& seg : p.ratios)
      for (double r : seg)
        ratios += std::to_string(r) + " ";
    const std::array<std::pair<const char*, const char*>, 4> what = {{
        {"model (traced graph)", "trace the same model with the same sizes and batch"},
        {"cluster file", "give every rank the same cluster file"},
        {"sharding ratios", "synthesize once, or from the same inputs, on every rank"},
        {"plan", "give every rank the same plan file or synthesis options"},
    }};
    const std::array<std::uint64_t, 4> mine = {synth::graph_hash(g), p.cluster_fingerprint,
                                               fnv1a64(ratios), p.hash()};
    const auto n = static_cast<std::size_t>(comm.size());
    std::vector<std::uint64_t> all(4 * n);
    comm.all_gather_v(std::span<const std::uint64_t>(mine), std::span<std::uint64_t>(all),
                      std::vector<std::size_t>(n, 4));
    for (std::size_t k = 0; k < what.size(); ++k)
      for (std::size_t r = 1; r < n; ++r)
        if (all[4 * r + k] != all[k])
          throw plan_error("rank " + std::to_string(r),
                           std::string("its ") + what[k].first + " differs from rank 0's (hash " +
                               synth::detail::hex(all[4 * r + k]) + " vs " +
                               synth::detail::hex(all[k]) + "); no training step was run",
                           what[k].second);
  }

  static local_program agreed_lower(const graph::graph& g, const synth::plan& p, Comm& comm) {
    if (p.device_names.size() != static_cast<std::size_t>(comm.size()))
      throw plan_error("plan " + p.strategy + " for " + p.cluster_name,
                       "has " + std::to_string(p.device_names.size()) + " devices but " +
                           std::to_string(comm.size()) + " ranks run it",
                       "launch one rank per device of the cluster (mpirun -np " +
                           std::to_string(p.device_names.size()) + ")");
    agree(g, p, comm);
    return lower(g, p, static_cast<std::size_t>(comm.rank()));
  }

  // Runs f; with a slowdown s, waits (s - 1) times as long again.
  template <class F>
  void compute(F&& f) {
    if (slowdown_ <= 1.0) {
      f();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    f();
    const auto took = std::chrono::steady_clock::now() - start;
    const auto until =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(took * (slowdown_ - 1.0));
    while (std::chrono::steady_clock::now() < until) {
    }
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
    for (const lowered_transfer& t : prog_.transfers)
      if (t.what.kind == synth::transfer_kind::load && t.what.tensor == *gid)
        piece_of(whole.data(), t.target, data_of<E>(t.target, false).data(), false);
  }

  // Copies this rank's piece of a whole tensor (dims of the global node) into `out`, or adds
  // the piece back into the whole (`back`).
  template <class E>
  void piece_of(const E* whole, graph::node_id local, E* out, bool back, E* whole_out = nullptr) {
    const node_layout& l = prog_.layouts[local];
    std::vector<std::size_t> start(l.global.size(), 0);
    if (l.split)
      start[*l.split] = l.offset;
    const auto ext = l.local_dims();
    const std::vector<std::size_t> zero(l.global.size(), 0);
    if (!back)
      copy_box(ex_.backend(), whole, l.global, start, out, ext, zero, ext, false);
    else
      copy_box(ex_.backend(), out, ext, zero, whole_out, l.global, start, ext, true);
  }

  // Rank-major blocks of a split version: counts and the pieces' dims.
  struct split_view {
    std::vector<std::size_t> counts, starts;
    std::vector<std::vector<std::size_t>> dims;
    std::vector<std::size_t> offsets; ///< along the split dimension
  };
  [[nodiscard]] split_view view_of(graph::node_id split_version) const {
    const node_layout& l = prog_.layouts[split_version];
    const auto& lens = prog_.lengths[split_version];
    split_view v;
    v.offsets = detail::starts_of(lens);
    for (std::size_t len : lens) {
      auto d = l.global;
      d[*l.split] = len;
      v.counts.push_back(detail::product(d));
      v.dims.push_back(std::move(d));
    }
    v.starts = detail::starts_of(v.counts);
    return v;
  }
  [[nodiscard]] bool leading(graph::node_id split_version) const {
    const node_layout& l = prog_.layouts[split_version];
    for (std::size_t d = 0; d < *l.split; ++d)
      if (l.global[d] != 1)
        return false;
    return true; // rank-major blocks are the whole tensor's layout
  }
  // whole (global layout) <-> rank-major blocks of a split version: `into_blocks` copies (or
  // adds) the whole into blocks, otherwise the blocks into the whole.
  template <class E>
  void reblock(const E* from, graph::node_id sv, E* to, bool into_blocks, bool add) {
    const node_layout& l = prog_.layouts[sv];
    const auto v = view_of(sv);
    const std::vector<std::size_t> zero(l.global.size(), 0);
    for (std::size_t r = 0; r < v.counts.size(); ++r) {
      auto start = zero;
      start[*l.split] = v.offsets[r];
      if (into_blocks)
        copy_box(ex_.backend(), from, l.global, start, to + v.starts[r], v.dims[r], zero, v.dims[r],
                 add);
      else
        copy_box(ex_.backend(), from + v.starts[r], v.dims[r], zero, to, l.global, start, v.dims[r],
                 add);
    }
  }

  // all-gather of split version `sv` (data `piece`) into the whole tensor `whole` (set or add).
  template <class E>
  void gather_into(graph::node_id sv, std::span<const E> piece, E* whole, bool add,
                   uneven_algorithm alg) {
    const auto v = view_of(sv);
    const std::size_t total = v.starts.back() + v.counts.back();
    std::vector<E> blocks(total);
    comm_->all_gather_v(piece, std::span<E>(blocks), std::span<const std::size_t>(v.counts), alg);
    if (leading(sv) && !add)
      std::copy(blocks.begin(), blocks.end(), whole);
    else
      reblock(blocks.data(), sv, whole, false, add);
  }
  // reduce-scatter of the whole partial tensor `whole` to this rank's piece of split version
  // `sv` (set or add).
  template <class E>
  void scatter_into(graph::node_id sv, std::span<const E> whole, E* piece, bool add,
                    uneven_algorithm alg) {
    const auto v = view_of(sv);
    std::vector<E> blocks(whole.size());
    reblock(whole.data(), sv, blocks.data(), true, false);
    const auto me = static_cast<std::size_t>(comm_->rank());
    std::vector<E> mine(v.counts[me]);
    comm_->reduce_scatter_v(std::span<const E>(blocks), std::span<E>(mine),
                            std::span<const std::size_t>(v.counts), reduce_op::sum, alg);
    for (std::size_t i = 0; i < mine.size(); ++i)
      piece[i] = add ? piece[i] + mine[i] : mine[i];
  }
  // all-to-all from split version `a` (data `in`) to split version `b` of the same tensor
  // (data `out`, set or add).
  template <class E>
  void exchange(graph::node_id a, std::span<const E> in, graph::node_id b, E* out, bool add) {
    const node_layout& la = prog_.layouts[a];
    const node_layout& lb = prog_.layouts[b];
    const std::size_t i = *la.split;
    const std::size_t j = *lb.split;
    const auto& li = prog_.lengths[a];
    const auto& lj = prog_.lengths[b];
    const auto oi = detail::starts_of(li);
    const auto oj = detail::starts_of(lj);
    const std::size_t n = li.size();
    const auto me = static_cast<std::size_t>(comm_->rank());
    const auto ain = la.local_dims();
    const auto bout = lb.local_dims();
    std::vector<std::size_t> send_counts(n), recv_counts(n);
    std::vector<std::vector<std::size_t>> send_dims(n), recv_dims(n);
    for (std::size_t s = 0; s < n; ++s) {
      send_dims[s] = la.global;
      send_dims[s][i] = li[me];
      send_dims[s][j] = lj[s];
      recv_dims[s] = la.global;
      recv_dims[s][i] = li[s];
      recv_dims[s][j] = lj[me];
      send_counts[s] = detail::product(send_dims[s]);
      recv_counts[s] = detail::product(recv_dims[s]);
    }
    const auto ss = detail::starts_of(send_counts);
    const auto rs = detail::starts_of(recv_counts);
    std::vector<E> send(ss.back() + send_counts.back());
    std::vector<E> recv(rs.back() + recv_counts.back());
    const std::vector<std::size_t> zero(la.global.size(), 0);
    for (std::size_t s = 0; s < n; ++s) {
      auto start = zero;
      start[j] = oj[s];
      copy_box(ex_.backend(), in.data(), ain, start, send.data() + ss[s], send_dims[s], zero,
               send_dims[s], false);
    }
    comm_->all_to_all_v(std::span<const E>(send), std::span<const std::size_t>(send_counts),
                        std::span<E>(recv), std::span<const std::size_t>(recv_counts));
    for (std::size_t s = 0; s < n; ++s) {
      auto start = zero;
      start[i] = oi[s];
      copy_box(ex_.backend(), recv.data() + rs[s], recv_dims[s], zero, out, bout, start,
               recv_dims[s], add);
    }
  }

  void transfer_forward(const lowered_transfer& t) {
    if (prog_.local[t.target].type == dtype::i64)
      move_forward<std::int64_t>(t);
    else
      move_forward<T>(t);
  }

  template <class E>
  void move_forward(const lowered_transfer& t) {
    using k = synth::transfer_kind;
    const graph::node_id src = *t.source;
    auto in = data_of<E>(src, false);
    auto out = data_of<E>(t.target, false);
    const std::span<const E> cin(in.data(), in.size());
    switch (t.what.kind) {
    case k::load:
      return;
    case k::slice:
      piece_of(in.data(), t.target, out.data(), false);
      return;
    case k::all_gather:
      gather_into(src, cin, out.data(), false, t.what.algorithm);
      return;
    case k::reduce_scatter:
      scatter_into(t.target, cin, out.data(), false, t.what.algorithm);
      return;
    case k::all_reduce:
      comm_->all_reduce(cin, out, reduce_op::sum);
      return;
    case k::all_to_all:
      exchange(src, cin, t.target, out.data(), false);
      return;
    case k::to_partial:
      std::fill(out.begin(), out.end(), E{});
      if (prog_.where[src].is_split())
        piece_of(out.data(), src, in.data(), true, out.data());
      else if (comm_->rank() == 0)
        std::copy(in.begin(), in.end(), out.begin());
      return;
    }
  }

  // The dual of transfer t: the target's gradient flows into the source's.
  void transfer_backward(const lowered_transfer& t) {
    using k = synth::transfer_kind;
    if (prog_.local[t.target].type == dtype::i64)
      return;
    const graph::node_id src = *t.source;
    auto gin = ex_.grad(src);
    auto gout = ex_.grad(t.target);
    const std::span<const T> cg(gout.data(), gout.size());
    switch (t.what.kind) {
    case k::load:
      return;
    case k::slice: // the piece's gradient, zero-padded: a partial sum of the whole's
      piece_of(gin.data(), t.target, gout.data(), true, gin.data());
      return;
    case k::all_gather:
      scatter_into(src, cg, gin.data(), true, t.what.algorithm);
      return;
    case k::reduce_scatter:
      gather_into(t.target, cg, gin.data(), true, t.what.algorithm);
      return;
    case k::all_reduce: {
      std::vector<T> sum(gout.size());
      comm_->all_reduce(cg, std::span<T>(sum), reduce_op::sum);
      for (std::size_t i = 0; i < sum.size(); ++i)
        gin[i] += sum[i];
      return;
    }
    case k::all_to_all:
      exchange(t.target, cg, src, gin.data(), true);
      return;
    case k::to_partial:
      to_partial_backward(src, gin, gout);
      return;
    }
  }
  void to_partial_backward(graph::node_id src, std::span<T> gin, std::span<T> gout) {
    if (prog_.where[src].is_split()) {
      std::vector<T> piece(gin.size());
      piece_of(gout.data(), src, piece.data(), false);
      for (std::size_t i = 0; i < piece.size(); ++i)
        gin[i] += piece[i];
    } else if (comm_->rank() == 0) {
      for (std::size_t i = 0; i < gin.size(); ++i)
        gin[i] += gout[i];
    }
  }

  // Replicated parameters: their gradients are partial sums; all-reduce them in buckets (or
  // take the SFB path the plan chose).
  void synchronize_gradients() {
    constexpr std::size_t bucket_bytes = std::size_t{25} << 20;
    std::vector<graph::node_id> pending;
    std::size_t pending_size = 0;
    const auto flush = [&] {
      if (pending.empty())
        return;
      std::vector<T> flat;
      flat.reserve(pending_size);
      for (graph::node_id id : pending)
        flat.insert(flat.end(), ex_.grad(id).begin(), ex_.grad(id).end());
      trace_.span("all_reduce gradients", trace_kind::communication,
                  {{"bytes", flat.size() * sizeof(T)}, {"parameters", pending.size()}},
                  [&] { comm_->all_reduce(std::span<T>(flat), reduce_op::sum); });
      std::size_t at = 0;
      for (graph::node_id id : pending) {
        auto gr = ex_.grad(id);
        std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), gr.size(), gr.begin());
        at += gr.size();
      }
      pending.clear();
      pending_size = 0;
    };
    for (const lowered_transfer& t : prog_.transfers) {
      if (t.what.kind != synth::transfer_kind::load ||
          g_[t.what.tensor].kind != graph::op::parameter || !t.what.to.is_replicated() ||
          comm_->size() == 1)
        continue;
      bool by_sfb = false;
      if (t.what.sfb)
        trace_.span("sfb " + g_[t.what.tensor].name, trace_kind::communication,
                    {{"bytes", ex_.grad(t.target).size() * sizeof(T)}},
                    [&] { by_sfb = sfb_gradient(t.target); });
      if (by_sfb)
        continue;
      pending.push_back(t.target);
      pending_size += ex_.grad(t.target).size();
      if (pending_size * sizeof(T) >= bucket_bytes)
        flush();
    }
    flush();
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

  bool sfb_gradient(graph::node_id w) {
    const std::optional<graph::node_id> user = sole_user(w);
    if (!user)
      return false;
    const graph::node& op = prog_.local[*user];
    if ((op.kind != graph::op::linear && op.kind != graph::op::matmul) || op.inputs[1] != w)
      return false;
    const graph::node_id x = op.inputs[0];
    const node_layout& lx = prog_.layouts[x];
    if (!lx.split || *lx.split + 1 >= lx.global.size())
      return false;
    const std::size_t k = lx.global.back();
    const std::size_t n = prog_.local[w].out.dims[1];
    std::vector<std::size_t> rows;
    for (std::size_t len : prog_.lengths[x]) {
      auto d = lx.global;
      d[*lx.split] = len;
      rows.push_back(detail::product(d) / std::max<std::size_t>(k, 1));
    }
    sfb_weight_gradient(*comm_, std::span<const T>(ex_.value(x)),
                        std::span<const T>(ex_.grad(*user)), std::span<const std::size_t>(rows), k,
                        n, ex_.grad(w));
    return true;
  }

  // The whole tensor of local version `id` on every rank (collective).
  std::vector<T> assemble(graph::node_id id) {
    const node_layout& l = prog_.layouts[id];
    std::vector<T> whole(l.global_size());
    const auto v = ex_.value(id);
    if (!l.split)
      std::copy(v.begin(), v.end(), whole.begin());
    else
      gather_into(id, std::span<const T>(v), whole.data(), false, uneven_algorithm::automatic);
    return whole;
  }

  const graph::graph& g_;
  Comm* comm_;
  local_program prog_;
  executor<T> ex_;
  double slowdown_ = 1.0;
  trace_recorder trace_;
  std::size_t gradient_bytes_ = 0;
};

} // namespace hspmd::exec
