#pragma once
// The transfers of a lowered plan on one rank: every placement change of the plan as a
// collective over the communicator (forward) and its dual (backward), with the reblocking
// between a tensor's global layout and the rank-major blocks the uneven collectives move. Box
// copies, sums and temporaries live on the executor's backend; the collectives move its buffers
// directly or staged through the host (exec/comm_span.hpp), so a device backend runs the same
// transfers over NCCL or over MPI.
//
//   forward                      backward (of the gradient)
//   slice      R -> S(d)         zero-padded piece added to the replicated version (a partial sum)
//   all-gather S(d) -> R         reduce-scatter
//   reduce-scatter P -> S(d)     all-gather
//   all-reduce P -> R            all-reduce
//   all-to-all S(i) -> S(j)      all-to-all S(j) -> S(i)
//   to-partial R -> P            the owner passes the gradient on
//   to-partial S(d) -> P         the rank's piece of the gradient

#include <hspmd/comm/communicator.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/batch_sink.hpp>
#include <hspmd/exec/comm_span.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/kernels/box.hpp>
#include <hspmd/kernels/shape.hpp>
#include <hspmd/program/layout.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/transfer.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd::exec {

namespace detail {

// Offsets of ranges of the given lengths (an exclusive prefix sum).
[[nodiscard]] inline std::vector<std::size_t> starts_of(const std::vector<std::size_t>& lengths) {
  std::vector<std::size_t> s(lengths.size(), 0);
  if (!lengths.empty())
    std::exclusive_scan(lengths.begin(), lengths.end(), s.begin(), std::size_t{0});
  return s;
}

[[nodiscard]] inline std::size_t product(const std::vector<std::size_t>& d) {
  return std::accumulate(d.begin(), d.end(), std::size_t{1}, std::multiplies<>{});
}

} // namespace detail

/// How a transfer of kind K runs on a rank: `forward(runner, t, in, out)` and
/// `backward(runner, t, gin, gout, add)` over a transfer_runner's moves (see `forward` and
/// `backward` there). One specialization per kind, a new kind's run (its facts are
/// synth::transfer_traits, its price cost_model::comm_of_kind).
template <synth::transfer_kind K>
struct transfer_run;

template <>
struct transfer_run<synth::transfer_kind::load> { // read where it lies; its gradient: buckets
  template <class R, class E>
  static void forward(R& /*r*/, const program::lowered_transfer& /*t*/, std::span<E> /*in*/,
                      std::span<E> /*out*/) {}
  template <class R, class E>
  static void backward(R& /*r*/, const program::lowered_transfer& /*t*/, std::span<E> /*gin*/,
                       std::span<E> /*gout*/, bool /*add*/) {}
};
template <>
struct transfer_run<synth::transfer_kind::slice> {
  template <class R, class E>
  static void forward(R& r, const program::lowered_transfer& t, std::span<E> in, std::span<E> out) {
    r.piece_of(in.data(), t.target, out.data(), false);
  }
  // The piece's gradient, zero-padded: a partial sum of the whole's.
  template <class R, class E>
  static void backward(R& r, const program::lowered_transfer& t, std::span<E> gin,
                       std::span<E> gout, bool /*add*/) {
    r.piece_of(gin.data(), t.target, gout.data(), true, gin.data());
  }
};
template <>
struct transfer_run<synth::transfer_kind::all_gather> {
  template <class R, class E>
  static void forward(R& r, const program::lowered_transfer& t, std::span<E> in, std::span<E> out) {
    r.gather_into(*t.source, std::span<const E>(in), out.data(), false, t.what.algorithm);
  }
  template <class R, class E>
  static void backward(R& r, const program::lowered_transfer& t, std::span<E> gin,
                       std::span<E> gout, bool add) {
    r.scatter_into(*t.source, std::span<const E>(gout), gin.data(), add, t.what.algorithm);
  }
};
template <>
struct transfer_run<synth::transfer_kind::reduce_scatter> {
  template <class R, class E>
  static void forward(R& r, const program::lowered_transfer& t, std::span<E> in, std::span<E> out) {
    r.scatter_into(t.target, std::span<const E>(in), out.data(), false, t.what.algorithm);
  }
  template <class R, class E>
  static void backward(R& r, const program::lowered_transfer& t, std::span<E> gin,
                       std::span<E> gout, bool add) {
    r.gather_into(t.target, std::span<const E>(gout), gin.data(), add, t.what.algorithm);
  }
};
template <>
struct transfer_run<synth::transfer_kind::all_reduce> {
  template <class R, class E>
  static void forward(R& r, const program::lowered_transfer& /*t*/, std::span<E> in,
                      std::span<E> out) {
    r.all_reduce_into(std::span<const E>(in), out);
  }
  template <class R, class E>
  static void backward(R& r, const program::lowered_transfer& /*t*/, std::span<E> gin,
                       std::span<E> gout, bool /*add*/) {
    r.all_reduce_add(std::span<const E>(gout), gin);
  }
};
template <>
struct transfer_run<synth::transfer_kind::all_to_all> {
  template <class R, class E>
  static void forward(R& r, const program::lowered_transfer& t, std::span<E> in, std::span<E> out) {
    r.exchange(*t.source, std::span<const E>(in), t.target, out.data(), false);
  }
  template <class R, class E>
  static void backward(R& r, const program::lowered_transfer& t, std::span<E> gin,
                       std::span<E> gout, bool add) {
    r.exchange(t.target, std::span<const E>(gout), *t.source, gin.data(), add);
  }
};
template <>
struct transfer_run<synth::transfer_kind::to_partial> {
  template <class R, class E>
  static void forward(R& r, const program::lowered_transfer& t, std::span<E> in, std::span<E> out) {
    r.to_partial_forward(*t.source, in, out);
  }
  template <class R, class E>
  static void backward(R& r, const program::lowered_transfer& t, std::span<E> gin,
                       std::span<E> gout, bool /*add*/) {
    r.to_partial_backward(*t.source, gin, gout);
  }
};

/// Runs the transfers of one rank's lowered program (see the file comment). Collective: every
/// rank runs the same transfer at the same time.
template <class T, class Comm, backend B>
class transfer_runner {
public:
  transfer_runner(const program::local_program& prog, Comm& comm, B& backend)
      : prog_(&prog), comm_(&comm), backend_(&backend) {}

  /// The whole tensor of split version `id` (data `piece`) on every rank, in host memory.
  std::vector<T> assemble(graph::node_id id, std::span<const T> piece) {
    const program::node_layout& l = prog_->layouts[id];
    std::vector<T> out(l.global_size());
    if (!l.split) {
      backend_->copy_to_host(out.data(), piece.data(), piece.size());
      return out;
    }
    auto whole = backend_->template allocate<T>(out.size());
    gather_into(id, piece, whole.data(), false, uneven_algorithm::automatic);
    backend_->copy_to_host(out.data(), whole.data(), out.size());
    return out;
  }

  /// Copies this rank's piece of a whole tensor (dims of the global node) into `out`, or adds
  /// the piece back into the whole (`back`).
  template <class E>
  void piece_of(const E* whole, graph::node_id local, E* out, bool back, E* whole_out = nullptr) {
    piece_of_on(*backend_, whole, local, out, back, whole_out);
  }
  /// The same on backend `be` (a host batch cut on the host before it goes to a device).
  template <class Be, class E>
  void piece_of_on(Be& be, const E* whole, graph::node_id local, E* out, bool back,
                   E* whole_out = nullptr) const {
    const program::node_layout& l = prog_->layouts[local];
    std::vector<std::size_t> start(l.global.size(), 0);
    if (l.split)
      start[*l.split] = l.offset;
    const auto ext = l.local_dims();
    const std::vector<std::size_t> zero(l.global.size(), 0);
    if (!back)
      copy_box(be, whole, l.global, start, out, ext, zero, ext, false);
    else
      copy_box(be, out, ext, zero, whole_out, l.global, start, ext, true);
  }

  // Rank-major blocks of a split version: counts and the pieces' dims.
  struct split_view {
    std::vector<std::size_t> counts, starts;
    std::vector<std::vector<std::size_t>> dims;
    std::vector<std::size_t> offsets; ///< along the split dimension
  };
  [[nodiscard]] split_view view_of(graph::node_id split_version) const {
    const program::node_layout& l = prog_->layouts[split_version];
    const auto& lens = prog_->lengths[split_version];
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
    const program::node_layout& l = prog_->layouts[split_version];
    for (std::size_t d = 0; d < *l.split; ++d)
      if (l.global[d] != 1)
        return false;
    return true; // rank-major blocks are the whole tensor's layout
  }
  // whole (global layout) <-> rank-major blocks of a split version: `into_blocks` copies (or
  // adds) the whole into blocks, otherwise the blocks into the whole.
  template <class E>
  void reblock(const E* from, graph::node_id sv, E* to, bool into_blocks, bool add) {
    const program::node_layout& l = prog_->layouts[sv];
    const auto v = view_of(sv);
    const std::vector<std::size_t> zero(l.global.size(), 0);
    for (std::size_t r = 0; r < v.counts.size(); ++r) {
      auto start = zero;
      start[*l.split] = v.offsets[r];
      if (into_blocks)
        copy_box(*backend_, from, l.global, start, to + v.starts[r], v.dims[r], zero, v.dims[r],
                 add);
      else
        copy_box(*backend_, from + v.starts[r], v.dims[r], zero, to, l.global, start, v.dims[r],
                 add);
    }
  }

  // A temporary of n elements of E: on host memory, for the executor's element type, one of
  // the runner's two kept buffers (grown, never shrunk: a step's collectives would otherwise
  // allocate, zero and fault in fresh pages each time); else a buffer of its own.
  template <class E>
  struct temporary {
    std::optional<decltype(std::declval<B&>().template allocate<E>(0))> own;
    E* kept = nullptr;
    [[nodiscard]] E* data() { return own ? own->data() : kept; }
  };
  template <class E>
  temporary<E> temporary_of(std::size_t slot, std::size_t n) {
    temporary<E> t;
    if constexpr (host_memory_v<B> && std::is_same_v<E, T>) {
      auto& buf = scratch_.at(slot);
      if (!buf || buf->size() < n)
        buf.emplace(backend_->template allocate<T>(n));
      t.kept = buf->data();
    } else {
      t.own.emplace(backend_->template allocate<E>(n));
    }
    return t;
  }

  // all-gather of split version `sv` (data `piece`) into the whole tensor `whole` (set or add).
  // Where the rank-major blocks are the whole's layout (a split of the leading dimension), the
  // collective writes the whole directly.
  template <class E>
  void gather_into(graph::node_id sv, std::span<const E> piece, E* whole, bool add,
                   uneven_algorithm alg) {
    const auto v = view_of(sv);
    const std::size_t total = v.starts.back() + v.counts.back();
    const bool direct = leading(sv) && !add;
    auto blocks = direct ? temporary<E>{} : temporary_of<E>(0, total);
    {
      comm_span<const E, Comm, B> in(*backend_, piece, true);
      comm_span<E, Comm, B> out(*backend_, std::span<E>(direct ? whole : blocks.data(), total),
                                false);
      comm_->all_gather_v(in.get(), out.get(), std::span<const std::size_t>(v.counts), alg);
      out.written();
    }
    if (!direct)
      reblock(blocks.data(), sv, whole, false, add);
  }
  // reduce-scatter of the whole partial tensor `whole` to this rank's piece of split version
  // `sv` (set or add).
  // (the whole is read in place where its layout is the rank-major blocks', and the sum is
  // written into the piece directly where it is set, not added)
  template <class E>
  void scatter_into(graph::node_id sv, std::span<const E> whole, E* piece, bool add,
                    uneven_algorithm alg) {
    const auto v = view_of(sv);
    const bool in_place = leading(sv);
    auto blocks = in_place ? temporary<E>{} : temporary_of<E>(0, whole.size());
    if (!in_place)
      reblock(whole.data(), sv, blocks.data(), true, false);
    const auto me = static_cast<std::size_t>(comm_->rank());
    auto mine = add ? temporary_of<E>(1, v.counts[me]) : temporary<E>{};
    {
      comm_span<const E, Comm, B> in(
          *backend_, std::span<const E>(in_place ? whole.data() : blocks.data(), whole.size()),
          true);
      comm_span<E, Comm, B> out(*backend_, std::span<E>(add ? mine.data() : piece, v.counts[me]),
                                false);
      comm_->reduce_scatter_v(in.get(), out.get(), std::span<const std::size_t>(v.counts),
                              reduce_op::sum, alg);
      out.written();
    }
    if (add)
      for_each_index(*backend_, v.counts[me], copy_elements<E>{mine.data(), piece, true});
  }
  // all-to-all from split version `a` (data `in`) to split version `b` of the same tensor
  // (data `out`, set or add).
  template <class E>
  void exchange(graph::node_id a, std::span<const E> in, graph::node_id b, E* out, bool add) {
    const program::node_layout& la = prog_->layouts[a];
    const program::node_layout& lb = prog_->layouts[b];
    const std::size_t i = *la.split;
    const std::size_t j = *lb.split;
    const auto& li = prog_->lengths[a];
    const auto& lj = prog_->lengths[b];
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
    const std::size_t sent = ss.back() + send_counts.back();
    const std::size_t received = rs.back() + recv_counts.back();
    auto send = temporary_of<E>(0, sent);
    auto recv = temporary_of<E>(1, received);
    const std::vector<std::size_t> zero(la.global.size(), 0);
    for (std::size_t s = 0; s < n; ++s) {
      auto start = zero;
      start[j] = oj[s];
      copy_box(*backend_, in.data(), ain, start, send.data() + ss[s], send_dims[s], zero,
               send_dims[s], false);
    }
    {
      comm_span<const E, Comm, B> cs(*backend_, std::span<const E>(send.data(), sent), true);
      comm_span<E, Comm, B> cr(*backend_, std::span<E>(recv.data(), received), false);
      comm_->all_to_all_v(cs.get(), std::span<const std::size_t>(send_counts), cr.get(),
                          std::span<const std::size_t>(recv_counts));
      cr.written();
    }
    for (std::size_t s = 0; s < n; ++s) {
      auto start = zero;
      start[i] = oi[s];
      copy_box(*backend_, recv.data() + rs[s], recv_dims[s], zero, out, bout, start, recv_dims[s],
               add);
    }
  }

  /// Transfer t forward: from the source version's data `in` to the target's `out`
  /// (transfer_run<K>::forward of its kind).
  template <class E>
  void forward(const program::lowered_transfer& t, std::span<E> in, std::span<E> out) {
    synth::visit_kind(t.what.kind, [&]<synth::transfer_kind K>() {
      transfer_run<K>::forward(*this, t, in, out);
    });
  }

  /// The dual of transfer t: the target's gradient `gout` flows into the source's `gin` (added;
  /// stored where `add` is false, for the kinds `dual_can_store`: an all-gather's dual then
  /// writes the piece and a reduce-scatter's the whole directly, without a staging buffer)
  /// (transfer_run<K>::backward of its kind).
  void backward(const program::lowered_transfer& t, std::span<T> gin, std::span<T> gout,
                bool add = true) {
    synth::visit_kind(t.what.kind, [&]<synth::transfer_kind K>() {
      transfer_run<K>::backward(*this, t, gin, gout, add);
    });
  }

  /// `out` = the sum over ranks of `in` (an all-reduce on the backend's buffers).
  template <class E>
  void all_reduce_into(std::span<const E> in, std::span<E> out) {
    comm_span<const E, Comm, B> ci(*backend_, in, true);
    comm_span<E, Comm, B> co(*backend_, out, false);
    comm_->all_reduce(ci.get(), co.get(), reduce_op::sum);
    co.written();
  }
  /// `out` += the sum over ranks of `in`.
  void all_reduce_add(std::span<const T> in, std::span<T> out) {
    auto sum = temporary_of<T>(0, in.size());
    all_reduce_into(in, std::span<T>(sum.data(), in.size()));
    for_each_index(*backend_, in.size(), copy_elements<T>{sum.data(), out.data(), true});
  }
  /// A replicated or split value as a partial sum: rank 0 keeps a replicated value, each rank its
  /// piece of a split one (zero elsewhere).
  template <class E>
  void to_partial_forward(graph::node_id src, std::span<E> in, std::span<E> out) {
    fill(*backend_, out.data(), out.size(), E{});
    if (prog_->where[src].is_split())
      piece_of(out.data(), src, in.data(), true, out.data());
    else if (comm_->rank() == 0)
      for_each_index(*backend_, in.size(), copy_elements<E>{in.data(), out.data(), false});
  }
  void to_partial_backward(graph::node_id src, std::span<T> gin, std::span<T> gout) {
    if (prog_->where[src].is_split()) {
      auto piece = temporary_of<T>(0, gin.size());
      piece_of(gout.data(), src, piece.data(), false);
      for_each_index(*backend_, gin.size(), copy_elements<T>{piece.data(), gin.data(), true});
    } else if (comm_->rank() == 0) {
      for_each_index(*backend_, gin.size(), copy_elements<T>{gout.data(), gin.data(), true});
    }
  }

private:
  const program::local_program* prog_;
  Comm* comm_;
  B* backend_;
  std::array<std::optional<decltype(std::declval<B&>().template allocate<T>(0))>, 2> scratch_;
};

/// What a rank's executor must know of the buffers its transfers touch (exec/distributed.hpp).
struct transfer_buffers {
  /// (source, target): the target's dual adds into the source's gradient outside the graph.
  std::vector<std::pair<graph::node_id, graph::node_id>> duals;
  std::vector<graph::node_id> stored;       ///< sources whose dual can store the gradient whole
  std::vector<graph::node_id> float_copies; ///< a master weight's copies: kept in float
  std::vector<graph::node_id> read_whole;   ///< sources: a transfer reads their value whole
};

/// The transfer buffers of `prog`, a rank's lowering of graph `g`.
[[nodiscard]] inline transfer_buffers transfer_buffers_of(const graph::graph& g,
                                                          const program::local_program& prog) {
  transfer_buffers b;
  for (const program::lowered_transfer& t : prog.transfers) {
    if (t.source) {
      b.duals.emplace_back(*t.source, t.target);
      b.read_whole.push_back(*t.source);
      if (synth::dual_can_store(t.what.kind))
        b.stored.push_back(*t.source);
    }
    if (g[t.what.tensor].kind == graph::op::parameter)
      b.float_copies.push_back(t.target);
  }
  return b;
}

/// The input node `name` of `g` that a rank feeds `size` values (ids or features) of, checked:
/// throws naming the input and the fix when it is none, or the size or the type is not its.
[[nodiscard]] inline graph::node_id checked_input(const graph::graph& g, std::string_view name,
                                                  std::size_t size, bool ids) {
  const graph::node_id id = input_node(g, name, ids, "distributed executor");
  if (size != g[id].out.size())
    throw shape_error("input \"" + std::string(name) + "\"",
                      std::to_string(size) + " values for shape " + g[id].out.to_string(),
                      "pass the whole batch on every rank; each keeps its piece");
  return id;
}

/// A traced transfer's arguments: its kind's tensor, bytes, placements, pass and algorithm.
[[nodiscard]] inline nlohmann::json
transfer_trace_args(const graph::graph& g, const program::lowered_transfer& t, bool backward) {
  const synth::transfer_kind kind = backward ? synth::dual(t.what.kind) : t.what.kind;
  const graph::node& whole = g[t.what.tensor];
  nlohmann::json args = {{"tensor", whole.name},
                         {"bytes", whole.out.size() * size_of(whole.type)},
                         {"placements", t.what.from.to_string() + " -> " + t.what.to.to_string()},
                         {"pass", backward ? "backward" : "forward"}};
  if (synth::takes_algorithm(kind))
    args["algorithm"] = std::string(name(t.what.algorithm));
  return args;
}

} // namespace hspmd::exec
