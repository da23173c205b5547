#pragma once
// The graph IR: what tracing a model records and what the synthesizer and the executor read.
//
// A graph is a list of nodes in execution order. Each node is one op with its inputs (earlier
// nodes), attributes, and the static shape and element type of its single output. Inputs
// (data fed each step) and parameters (trained weights, with names such as layers.3.attn.wq)
// are nodes too. Shapes are fully static once the batch is bound; the batch dimension stays
// marked (`shape::batch_dim`) because it is the one every plan can split.
//
// Per node the registry (graph/ops.hpp) gives the output shape, the forward and backward FLOPs
// and bytes and the placement signature; graph/io.hpp prints a graph as a table and
// round-trips it through JSON.

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/extents.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/graph/ops/list.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::graph {

/// Index of a node in its graph.
using node_id = std::uint32_t;

/// The ops of the IR, from the registry's list (graph/ops/list.hpp); what each op computes, its
/// shape rule, cost and placement signature are in its `op_traits` (graph/ops/<family>.hpp).
enum class op : std::uint8_t {
#define HSPMD_GRAPH_OP_ENUM(o, form) o,
  HSPMD_GRAPH_OPS(HSPMD_GRAPH_OP_ENUM)
#undef HSPMD_GRAPH_OP_ENUM
};
inline constexpr std::size_t op_count = 0
#define HSPMD_GRAPH_OP_COUNT(o, form) +1
    HSPMD_GRAPH_OPS(HSPMD_GRAPH_OP_COUNT)
#undef HSPMD_GRAPH_OP_COUNT
    ;

/// "matmul", "layer_norm", ...: the op's identifier in the registry's list.
[[nodiscard]] constexpr std::string_view name(op o) noexcept {
  constexpr std::array<std::string_view, op_count> names = {
#define HSPMD_GRAPH_OP_NAME(o, form) #o,
      HSPMD_GRAPH_OPS(HSPMD_GRAPH_OP_NAME)
#undef HSPMD_GRAPH_OP_NAME
  };
  return names.at(static_cast<std::size_t>(o));
}

/// Inverse of `name`.
[[nodiscard]] constexpr std::optional<op> parse_op(std::string_view s) noexcept {
  for (std::size_t i = 0; i < op_count; ++i)
    if (name(static_cast<op>(i)) == s)
      return static_cast<op>(i);
  return std::nullopt;
}

/// The registry's facts of op O: a specialization per op in graph/ops/<family>.hpp, collected
/// and checked for completeness by graph/ops.hpp.
template <op O>
struct op_traits;

/// Attributes; which ones an op reads is documented at the op.
struct attributes {
  double scalar = 0.0;           ///< scale factor, layer-norm epsilon
  std::vector<std::size_t> dims; ///< reshape target, permutation
  bool flag = false;             ///< batched_matmul: second operand transposed
  friend bool operator==(const attributes&, const attributes&) = default;
};

/// How a parameter is initialized: N(0, stddev^2), or a constant (LayerNorm's gamma = 1).
struct initializer {
  enum class kind : std::uint8_t { normal, constant } how = kind::normal;
  double value = 0.0; ///< stddev for normal, the value for constant
  friend bool operator==(const initializer&, const initializer&) = default;
};

/// One node: an op, its inputs, attributes, and its output's shape and type.
struct node {
  graph::op kind = op::input;
  std::string name; ///< parameters: "layers.3.attn.wq"; other nodes: op + index
  std::vector<node_id> inputs;
  attributes attrs;
  hspmd::shape out; ///< static shape of the output (batch dimension marked)
  dtype type = dtype::f32;
  initializer init; ///< parameters only
  /// A placement the model fixed in its types (manual SPMD): the node runs locally on its
  /// operands' pinned placements and yields this one; the synthesizer keeps it.
  std::optional<placement> pin;
  friend bool operator==(const node&, const node&) = default;
};

/// A traced program: nodes in execution order and the node whose value is the loss.
class graph {
public:
  /// Appends a node (inputs must be earlier nodes) and returns its id.
  node_id add(node n) {
    for (node_id in : n.inputs)
      if (in >= nodes_.size())
        throw plan_error("graph node \"" + n.name + "\"",
                         "input " + std::to_string(in) + " is not an earlier node",
                         "add nodes in execution order");
    nodes_.push_back(std::move(n));
    return static_cast<node_id>(nodes_.size() - 1);
  }

  [[nodiscard]] const node& operator[](node_id id) const { return nodes_.at(id); }
  [[nodiscard]] node& operator[](node_id id) { return nodes_.at(id); }
  [[nodiscard]] std::size_t size() const noexcept { return nodes_.size(); }
  [[nodiscard]] const std::vector<node>& nodes() const noexcept { return nodes_; }

  /// The loss: a scalar node training differentiates.
  void set_loss(node_id id) {
    if (id >= nodes_.size() || nodes_[id].out.rank() != 0)
      throw plan_error("graph", "the loss must be a scalar node",
                       "reduce the output (sum, mean, cross_entropy) before marking it");
    loss_ = id;
  }
  [[nodiscard]] std::optional<node_id> loss() const noexcept { return loss_; }

  /// Ids of nodes of one kind, in order.
  [[nodiscard]] std::vector<node_id> of_kind(op k) const {
    std::vector<node_id> ids;
    for (node_id i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].kind == k)
        ids.push_back(i);
    return ids;
  }
  [[nodiscard]] std::vector<node_id> parameters() const { return of_kind(op::parameter); }
  [[nodiscard]] std::vector<node_id> inputs() const { return of_kind(op::input); }

  /// The node named `name`, if any.
  [[nodiscard]] std::optional<node_id> find(std::string_view name) const {
    for (node_id i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].name == name)
        return i;
    return std::nullopt;
  }

  friend bool operator==(const graph&, const graph&) = default;

private:
  std::vector<node> nodes_;
  std::optional<node_id> loss_;
};

} // namespace hspmd::graph
