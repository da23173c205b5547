#pragma once
// What every op's registry entry (`op_traits<O>`, one per op in graph/ops/<family>.hpp) states,
// and the helpers entries share. An entry has these facts; graph/ops.hpp refuses to build when
// one is missing and names the op:
//
//   summary     what the op computes (one line; attributes it reads)
//   arity       how many inputs (`variadic`: one or more)
//   shape       the output shape from the inputs (throws `shape_error` naming the node)
//   cost        forward and backward FLOPs and bytes (the conventions below)
//   signature   its placement signature (constexpr; graph/signature.hpp, graph/rules.hpp)
//   examples    small valid calls: the gradient checks and the kernel tests run every one
//   rate        the class of work that prices it on a device (`work`: GEMM, elementwise,
//               softmax; a device's class rates in the cluster file, synth/cost.hpp)
//   view        whether its value can be its input's elements where they lie (`view_kind`):
//               the executor then allocates nothing for it and the cost model counts no memory
//
// FLOP conventions (exact for the kernels in kernels/): a multiply-add is 2 FLOPs; exp,
// log, tanh, erf and sqrt count 1 each; comparisons (max) count 1. Backward FLOPs count every
// input gradient the op can produce, including those of inputs that need none (e.g. the data
// of the first layer): the executor computes them, and the synthesizer must not under-count.
// Bytes are what the kernel reads plus what it writes, in the graph's element type; backward
// reads the output gradient and the saved operands and writes the input gradients.

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/signature.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::graph {

/// The class of work of an op: which of a device's rates prices it (a cluster file's class
/// rates; synth::op_class_of).
enum class work : std::uint8_t { gemm, elementwise, softmax };

/// Whether an op's value can be a view of its input's elements where they lie.
enum class view_kind : std::uint8_t {
  none,     ///< its own buffer
  reshaped, ///< the same elements in the same order (a reshape of the same type)
  strided,  ///< the same elements with dimensions 1 and 2 exchanged, read by strides where the
            ///< values next to it allow it (graph::swapped_values: a permute by a batched matmul)
};

/// Forward and backward cost of one node.
struct node_cost {
  double forward_flops = 0.0;
  double backward_flops = 0.0;
  double forward_bytes = 0.0;
  double backward_bytes = 0.0;
};

/// `op_traits::arity` of an op that takes one or more inputs (concat).
inline constexpr std::size_t variadic = std::numeric_limits<std::size_t>::max();

/// One input of an example call: its dimensions and type.
struct example_input {
  std::vector<std::size_t> dims;
  dtype type = dtype::f64;
  bool positive = false; ///< values drawn in (0.5, 1.5) instead of N(0, 1) (probabilities)
};
/// A small valid call of an op, for the gradient checks and kernel tests.
struct op_example {
  std::string label;
  std::vector<example_input> inputs;
  attributes attrs{};
  std::size_t id_limit = 4; ///< integer inputs are drawn in [0, id_limit)
};

/// The node's inputs' shapes, read by `op_traits::shape` and `op_traits::cost`.
class node_view {
public:
  node_view(const graph& g, const node& n) : g_(&g), n_(&n) {}
  [[nodiscard]] const node& self() const noexcept { return *n_; }
  [[nodiscard]] const attributes& attrs() const noexcept { return n_->attrs; }
  [[nodiscard]] std::size_t arity() const noexcept { return n_->inputs.size(); }
  [[nodiscard]] const hspmd::shape& in(std::size_t k) const { return (*g_)[n_->inputs.at(k)].out; }
  [[nodiscard]] const hspmd::shape& out() const noexcept { return n_->out; }
  /// Elements of input k and of the output, as doubles (for costs).
  [[nodiscard]] double in_size(std::size_t k) const { return static_cast<double>(in(k).size()); }
  [[nodiscard]] double out_size() const { return static_cast<double>(n_->out.size()); }
  /// Bytes of one element.
  [[nodiscard]] double element_bytes() const { return static_cast<double>(size_of(n_->type)); }

  /// "graph node "name" (op)".
  [[nodiscard]] std::string where() const {
    return "graph node \"" + n_->name + "\" (" + std::string(name(n_->kind)) + ")";
  }
  /// Throws `shape_error` naming the node.
  [[noreturn]] void fail(const std::string& why, const std::string& fix) const {
    throw shape_error(where(), why, fix);
  }

  /// Default cost: no FLOPs; forward reads the inputs and writes the output, backward reads the
  /// output gradient and the inputs and writes one gradient per input.
  [[nodiscard]] node_cost memory_cost() const {
    double in_elems = 0.0;
    for (std::size_t k = 0; k < arity(); ++k)
      in_elems += in_size(k);
    node_cost c;
    c.forward_bytes = (in_elems + out_size()) * element_bytes();
    c.backward_bytes = (out_size() + 2.0 * in_elems) * element_bytes();
    return c;
  }
  /// `memory_cost` plus `forward` and `backward` FLOPs per output element.
  [[nodiscard]] node_cost per_element_cost(double forward, double backward) const {
    node_cost c = memory_cost();
    c.forward_flops = forward * out_size();
    c.backward_flops = backward * out_size();
    return c;
  }

private:
  const graph* g_;
  const node* n_;
};

/// Numpy-style broadcast of two shapes over trailing dimensions (the batch mark follows the
/// operand of full rank); throws naming node `v` when they do not broadcast.
[[nodiscard]] inline hspmd::shape broadcast_shapes(const node_view& v, const hspmd::shape& a,
                                                   const hspmd::shape& b) {
  const std::size_t r = std::max(a.rank(), b.rank());
  hspmd::shape out;
  out.dims.resize(r);
  for (std::size_t i = 0; i < r; ++i) {
    const std::size_t ai = i + a.rank() >= r ? a.dims[i + a.rank() - r] : 1;
    const std::size_t bi = i + b.rank() >= r ? b.dims[i + b.rank() - r] : 1;
    if (ai != bi && ai != 1 && bi != 1)
      v.fail("cannot broadcast " + a.to_string() + " with " + b.to_string(),
             "trailing dimensions must be equal or 1");
    out.dims[i] = std::max(ai, bi);
  }
  if (a.batch_dim && a.rank() == r)
    out.batch_dim = a.batch_dim;
  else if (b.batch_dim && b.rank() == r)
    out.batch_dim = b.batch_dim;
  return out;
}

/// Rows of a tensor viewed as (rows, last dimension); a scalar is one row.
[[nodiscard]] inline std::size_t rows_of(const hspmd::shape& s) {
  if (s.rank() == 0)
    return 1;
  return s.dims.back() == 0 ? 0 : s.size() / s.dims.back();
}

/// Shared entry of ops that map x to an output of x's shape, element by element, at `F` and
/// `B` FLOPs per element forward and backward.
template <int F, int B>
struct unary_elementwise {
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) { return v.in(0); }
  static node_cost cost(const node_view& v) { return v.per_element_cost(F, B); }
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    b.same_as_input(0);
  }
  static std::vector<op_example> examples() { return {{"", {{{3, 5}}}}}; }
};

} // namespace hspmd::graph
