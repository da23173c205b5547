#pragma once
// One rank's share of a two-level plan (synth/hierarchical.hpp): the node's program runs on a
// distributed executor over the node's ranks, on the node's rows of the batch; after its
// backward, the gradients are all-reduced across nodes between the ranks at the same position:
//
//   replicated parameters  (already summed inside the node) each rank all-reduces its 1/L of
//                          the packed gradients across nodes, then the node all-gathers them
//                          back: the composed intra / inter / intra collective;
//   split parameters       a shard goes straight across when it has the same length in every
//                          node, else it is assembled inside the node, all-reduced whole and cut
//                          again (correct; L times the traffic).
//
// A node's loss is its rows' mean; each node's gradients are weighted by its share of the rows
// before the sum (1 for a summed loss), so the result is the whole batch's, as in one process.
// The cross-node step runs after the backward (not overlapped; the planner prices it so), 16 MiB
// of gradients per call (`set_cross_node_bytes`), so its packed copy stays small.
//
// A node with no rows (the plan's `active(k)` is false: its devices cannot hold one row) sits
// out: its ranks build nothing and idle; on them `active()` is false, `forward` returns 0 and
// `backward` does nothing, and `inner`, `local` and `gather` refuse (a training loop skips its
// optimizer step there).
#include <hspmd/exec/distributed.hpp>
#include <hspmd/synth/hierarchical.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace hspmd::exec {

/// One rank's share of a two-level plan, over MPI-like communicators that can `split`.
template <std::floating_point T, class Comm>
requires requires(const Comm& c) {
  { c.split(0, 0) } -> std::same_as<Comm>;
}
class hierarchical_executor {
public:
  /// `node_graph`: the model traced for this rank's node's rows (`p.node_batch`; unused where
  /// the node sits out, so any graph, e.g. the whole batch's, will do there); `world`: every
  /// rank, rank r being device r of the plan's cluster. Collective over `world`: the ranks
  /// check they hold the same plan (`plan_error` on every rank otherwise), split into node and
  /// position communicators and lower the node's program. `p` need not outlive the executor.
  hierarchical_executor(const graph::graph& node_graph, const synth::hierarchical_plan& p,
                        Comm& world, std::uint64_t seed = 0)
      : where_(locate(p, world)), batch_(p.batch), rows_(p.node_batch[where_.node]),
        first_row_(first_row_of(p, where_.node)),
        node_comm_(world.split(int(where_.node), where_.pos)),
        // idle ranks in groups of their own, apart from the training nodes'
        cross_(world.split(rows_ > 0 ? where_.pos : int(p.nodes.front().size()) + where_.pos,
                           int(where_.node))) {
    if (rows_ == 0)
      return;
    inner_.emplace(node_graph, p.node_plan(where_.node), node_comm_, seed);
    if (p.node_plan(where_.node).recompute) // the node program's memory counts on it
      inner_->recompute();
    const graph::node& loss = node_graph[*node_graph.loss()];
    const bool summed = loss.kind == graph::op::sum ||
                        (loss.kind == graph::op::cross_entropy && loss.attrs.scalar == 0.0);
    weight_ = summed ? 1.0 : double(rows_) / double(batch_);
    // Random masks (dropout) are drawn by element index in the whole tensor: a tensor whose
    // outermost dimension runs along the batch starts at the node's first row.
    const synth::segment_map seg(node_graph, synth::segment_policy::one);
    const program::local_program& prog = inner_->program();
    for (graph::node_id i = 0; i < prog.local.size(); ++i) {
      const graph::node& v = node_graph[prog.global[i]];
      if (!v.out.dims.empty() && seg.is_batch(prog.global[i], 0))
        inner_->local().set_element_base(i, first_row_ * (v.out.size() / rows_));
    }
    classify();
  }
  hierarchical_executor(const hierarchical_executor&) = delete;
  hierarchical_executor& operator=(const hierarchical_executor&) = delete;

  /// This rank's node (index into the plan's nodes) and position in it.
  [[nodiscard]] std::size_t node() const noexcept { return where_.node; }
  [[nodiscard]] int position() const noexcept { return where_.pos; }
  /// Whether this rank's node trains (holds rows of the batch); see the file comment.
  [[nodiscard]] bool active() const noexcept { return rows_ > 0; }
  /// The node's executor (its local graph, pieces and gradients); optimizers step its `local()`.
  [[nodiscard]] distributed_executor<T, Comm>& inner() { return working(); }
  [[nodiscard]] executor<T>& local() { return working().local(); }

  /// How many of the node program's parameters go across nodes each way: replicated (composed
  /// collective), aligned shards, shards that do not line up.
  [[nodiscard]] std::array<std::size_t, 3> cross_node_ways() const noexcept {
    return {replicated_.size(), aligned_.size(), misaligned_.size()};
  }

  /// Bytes of gradients packed per cross-node call (default 16 MiB; the same on every rank).
  void set_cross_node_bytes(std::size_t bytes) noexcept {
    chunk_bytes_ = std::max<std::size_t>(bytes, sizeof(T));
  }

  void set_step(std::uint64_t s) noexcept {
    if (inner_)
      inner_->set_step(s);
  }
  void set_training(bool on) noexcept {
    if (inner_)
      inner_->set_training(on);
  }

  /// Feeds input `name` from the whole batch (every rank the same); the node keeps its rows.
  void set_input(std::string_view name, std::span<const T> whole) { feed(name, whole); }
  void set_input(std::string_view name, std::span<const std::int64_t> whole) { feed(name, whole); }

  /// Forward on every rank; returns the whole batch's loss (the same on every training rank; 0
  /// on the ranks of a node that sits out).
  T forward() {
    if (!inner_)
      return T{0};
    const double mine = weight_ * static_cast<double>(inner_->forward());
    return static_cast<T>(cross_.all_reduce(mine, reduce_op::sum));
  }

  /// Backward inside the node, then the gradients across nodes (see the file comment).
  void backward() {
    if (!inner_)
      return;
    inner_->backward();
    cross_node_gradients();
  }

  /// Clips to global norm `max_norm` (every node holds the whole gradient: the node's norm is
  /// the global one); returns the norm before clipping.
  double clip_grad_norm(double max_norm) { return inner_ ? inner_->clip_grad_norm(max_norm) : 0.0; }

  /// The whole value of parameter `name` (collective over the node).
  [[nodiscard]] std::vector<T> gather(std::string_view name) { return working().gather(name); }

private:
  struct place {
    std::size_t node = 0;
    int pos = 0;
  };

  static place locate(const synth::hierarchical_plan& p, Comm& world) {
    std::size_t devices = 0;
    for (const auto& n : p.nodes)
      devices += n.size();
    if (devices != static_cast<std::size_t>(world.size()))
      throw plan_error("hierarchical plan of " + p.cluster_name,
                       std::to_string(devices) + " devices for " + std::to_string(world.size()) +
                           " ranks",
                       "launch one rank per device of the cluster");
    // Every rank must hold the same plan: rank 0's hash against each.
    std::uint64_t first = p.hash();
    detail::control_of(world).broadcast(std::span<std::uint64_t>(&first, 1), 0);
    const std::int64_t differs = world.all_reduce(
        static_cast<std::int64_t>(first == p.hash() ? world.size() : world.rank()), reduce_op::min);
    if (differs < world.size())
      throw plan_error("hierarchical plan of " + p.cluster_name,
                       "rank " + std::to_string(differs) + " holds a different plan than rank 0",
                       "synthesize the plan on every rank from the same model, batch and "
                       "cluster (or read the same plan)");
    const auto me = static_cast<std::size_t>(world.rank());
    for (std::size_t k = 0; k < p.nodes.size(); ++k)
      for (std::size_t i = 0; i < p.nodes[k].size(); ++i)
        if (p.nodes[k][i] == me)
          return {k, static_cast<int>(i)};
    throw plan_error("hierarchical plan of " + p.cluster_name,
                     "rank " + std::to_string(me) + " is in no node", "use the plan's cluster");
  }

  // The node's first row in the whole batch.
  static std::size_t first_row_of(const synth::hierarchical_plan& p, std::size_t node) {
    std::size_t first = 0;
    for (std::size_t k = 0; k < node; ++k)
      first += p.node_batch[k];
    return first;
  }

  distributed_executor<T, Comm>& working() {
    if (!inner_)
      throw plan_error("hierarchical executor",
                       "node " + std::to_string(where_.node) +
                           " sits this plan out (its devices hold no row of the batch)",
                       "check active() and skip the node's work on its ranks");
    return *inner_;
  }

  template <class E>
  void feed(std::string_view name, std::span<const E> whole) {
    if (!inner_)
      return;
    if (whole.size() % batch_ != 0)
      throw shape_error("input \"" + std::string(name) + "\"",
                        std::to_string(whole.size()) + " values are not " + std::to_string(batch_) +
                            " rows",
                        "pass the whole batch, its rows outermost, on every rank");
    const std::size_t per_row = whole.size() / batch_;
    inner_->set_input(name, whole.subspan(first_row_ * per_row, rows_ * per_row));
  }

  // Sorts the node program's parameters into the three ways across nodes (collective over
  // the position communicator: shard lengths are compared).
  void classify() {
    const program::local_program& prog = inner_->program();
    std::vector<graph::node_id> split;
    for (graph::node_id id : prog.local.parameters())
      (prog.where[id].is_split() ? split : replicated_).push_back(id);
    std::vector<std::int64_t> lo;
    for (graph::node_id id : split)
      lo.push_back(static_cast<std::int64_t>(inner_->local().grad(id).size()));
    std::vector<std::int64_t> hi = lo;
    if (!lo.empty()) {
      cross_.all_reduce(std::span<std::int64_t>(lo), reduce_op::min);
      cross_.all_reduce(std::span<std::int64_t>(hi), reduce_op::max);
    }
    for (std::size_t i = 0; i < split.size(); ++i)
      (lo[i] == hi[i] ? aligned_ : misaligned_).push_back(split[i]);
  }

  void cross_node_gradients() {
    executor<T>& ex = inner_->local();
    const auto pack = [&](const std::vector<graph::node_id>& ids, std::vector<T>& flat) {
      flat.clear();
      for (graph::node_id id : ids)
        for (T x : ex.grad(id))
          flat.push_back(static_cast<T>(weight_ * static_cast<double>(x)));
    };
    const auto unpack = [&](const std::vector<graph::node_id>& ids, const std::vector<T>& flat) {
      std::size_t at = 0;
      for (graph::node_id id : ids) {
        auto g = ex.grad(id);
        std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), g.size(), g.begin());
        at += g.size();
      }
    };
    // Replicated: my 1/L across nodes, then the node gathers the pieces; a chunk of parameters
    // at a time, so the packed copy stays small.
    for (const auto& ids : chunks(replicated_)) {
      pack(ids, flat_);
      const auto l = static_cast<std::size_t>(node_comm_.size());
      std::vector<std::size_t> counts(l, flat_.size() / l);
      for (std::size_t i = 0; i < flat_.size() % l; ++i)
        ++counts[i];
      std::size_t first = 0;
      for (std::size_t i = 0; i < static_cast<std::size_t>(where_.pos); ++i)
        first += counts[i];
      const std::span<T> mine(flat_.data() + first, counts[static_cast<std::size_t>(where_.pos)]);
      cross_.all_reduce(mine, reduce_op::sum);
      node_comm_.all_gather_v(std::span<T>(flat_), std::span<const std::size_t>(counts),
                              uneven_algorithm::automatic);
      unpack(ids, flat_);
    }
    // Shards of the same length in every node: straight across.
    for (const auto& ids : chunks(aligned_)) {
      pack(ids, flat_);
      cross_.all_reduce(std::span<T>(flat_), reduce_op::sum);
      unpack(ids, flat_);
    }
    // Shards that do not line up: whole inside the node, across, cut again.
    for (graph::node_id id : misaligned_) {
      std::vector<T> whole = inner_->gradient_whole(id);
      for (T& x : whole)
        x = static_cast<T>(weight_ * static_cast<double>(x));
      cross_.all_reduce(std::span<T>(whole), reduce_op::sum);
      inner_->set_gradient_piece(id, std::span<const T>(whole));
    }
  }

  // `ids` in consecutive groups of at most `chunk_bytes_` of gradients (a larger one alone);
  // the same groups on every rank of a position communicator, whose members hold equal sizes.
  [[nodiscard]] std::vector<std::vector<graph::node_id>>
  chunks(const std::vector<graph::node_id>& ids) {
    std::vector<std::vector<graph::node_id>> out;
    std::size_t bytes = 0;
    for (graph::node_id id : ids) {
      const std::size_t b = inner_->local().grad(id).size() * sizeof(T);
      if (out.empty() || (bytes > 0 && bytes + b > chunk_bytes_)) {
        out.emplace_back();
        bytes = 0;
      }
      out.back().push_back(id);
      bytes += b;
    }
    return out;
  }

  place where_;
  std::size_t batch_;     // rows of the whole batch
  std::size_t rows_;      // this node's rows
  std::size_t first_row_; // where they start

  Comm node_comm_;
  Comm cross_;
  std::optional<distributed_executor<T, Comm>> inner_; // none where the node sits out
  double weight_ = 1.0;
  std::vector<graph::node_id> replicated_;
  std::vector<graph::node_id> aligned_;
  std::vector<graph::node_id> misaligned_;
  std::vector<T> flat_;
  std::size_t chunk_bytes_ = std::size_t{16} << 20;
};

} // namespace hspmd::exec
