#pragma once
// Per-op rules of the IR in one place: the output shape of a node from its inputs, and its
// forward and backward FLOPs and bytes.
//
// FLOP conventions (exact for the kernels in exec/): a multiply-add is 2 FLOPs; exp, log, tanh,
// erf and sqrt count 1 each; comparisons (max) count 1. Backward FLOPs count every input
// gradient the op can produce, including those of inputs that need none (e.g. the data of the
// first layer): the executor computes them, and the synthesizer must not under-count.
// Bytes are what the kernel reads plus what it writes, in the graph's element type; backward
// reads the output gradient and the saved operands and writes the input gradients.
//
//   op              forward FLOPs                         backward FLOPs
//   matmul m,k,n    2 m k n                               4 m k n            (dA and dB)
//   linear          2 m k n + m n                         4 m k n + m n      (+ bias gradient)
//   batched_matmul  2 b m k n                             4 b m k n
//   add, sub        n                                     n per broadcast-reduced element
//   mul             n                                     2 n (+ reduction for broadcasts)
//   scale           n                                     n
//   relu            n                                     n
//   gelu            6 n  (x/sqrt2, erf, +1, *0.5, *x)     9 n
//   tanh            n                                     3 n
//   sigmoid         3 n  (neg, exp, 1/(1+e))              3 n
//   softmax  (R,L)  5 L R  (max, sub, exp, sum, div)      4 L R
//   log_softmax     5 L R  (max, sub, exp, sum, log+sub)  4 L R
//   layer_norm      8 L R                                 11 L R + 4 L R (dgamma, dbeta)
//   embedding       0 (a gather)                          N H (scatter-add)
//   cross_entropy   5 V N + N                             3 V N
//   sum, mean       n (mean + 1)                          n
//   reshape         0                                     0
//   permute         0 (a copy: bytes only)                0
//   dropout         2 n (draw+compare, scale)             n
//   slice, concat   0 (copies: bytes only)                0 (gradient additions not counted)
//   conv2d          2 N K Ho Wo C R S + N K Ho Wo         4 N K Ho Wo C R S + N K Ho Wo
//                   (the kernel size counts: HAP's cost model left it out)
//   max_pool2d      N C Ho Wo (k^2 - 1) comparisons       N C Ho Wo
//   adaptive_avg_pool2d  one add per input element of each window, + 1 per output; backward alike
//   broadcast       0 (a copy)                            n (the reduction of the gradient)
//   moe_dispatch    T E (top-2 search; copies are bytes)  0 (copies back)
//   moe_combine     4 T H (two scaled adds per token)     4 T H + 8 T (gate gradients)
// (the experts' FFNs are batched matmuls of their own: 2 E C H F each way, C the capacity)
// A causal softmax is counted like a full one (the masked half is skipped, not free of passes).

#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace hspmd::graph {

namespace detail {

[[nodiscard]] inline std::string where(const node& n) {
  return "graph node \"" + n.name + "\" (" + std::string(name(n.kind)) + ")";
}

[[noreturn]] inline void shape_fail(const node& n, const std::string& why, const std::string& fix) {
  throw shape_error(where(n), why, fix);
}

inline void need_inputs(const node& n, std::size_t count) {
  if (n.inputs.size() != count)
    shape_fail(n, std::to_string(n.inputs.size()) + " inputs",
               std::to_string(count) + " inputs for " + std::string(name(n.kind)));
}

// Numpy-style broadcast of two shapes over trailing dimensions.
[[nodiscard]] inline hspmd::shape broadcast(const node& n, const hspmd::shape& a,
                                            const hspmd::shape& b) {
  const std::size_t r = std::max(a.rank(), b.rank());
  hspmd::shape out;
  out.dims.resize(r);
  for (std::size_t i = 0; i < r; ++i) {
    const std::size_t ai = i + a.rank() >= r ? a.dims[i + a.rank() - r] : 1;
    const std::size_t bi = i + b.rank() >= r ? b.dims[i + b.rank() - r] : 1;
    if (ai != bi && ai != 1 && bi != 1)
      shape_fail(n, "cannot broadcast " + a.to_string() + " with " + b.to_string(),
                 "trailing dimensions must be equal or 1");
    out.dims[i] = std::max(ai, bi);
  }
  if (a.batch_dim && a.rank() == r)
    out.batch_dim = a.batch_dim;
  else if (b.batch_dim && b.rank() == r)
    out.batch_dim = b.batch_dim;
  return out;
}

// Window [begin, end) of output cell i when adaptively pooling `in` cells to `out`.
[[nodiscard]] constexpr std::size_t pool_begin(std::size_t i, std::size_t in, std::size_t out) {
  return i * in / out;
}
[[nodiscard]] constexpr std::size_t pool_end(std::size_t i, std::size_t in, std::size_t out) {
  return ((i + 1) * in + out - 1) / out;
}

[[nodiscard]] inline std::size_t rows_of(const hspmd::shape& s) {
  return s.rank() == 0 ? 1 : s.size() / s.dims.back();
}

} // namespace detail

/// Top-2 routing of a mixture-of-experts layer, the same in dispatch and combine.
/// For each token t: experts[2t], experts[2t+1] are its two most probable experts (ties to the
/// lower index), slots the positions in their buffers (or `dropped` past the capacity), and the
/// gates p_e / (p_e1 + p_e2). Slots are handed out to every token's first choice in token order,
/// then to second choices, so first choices win when an expert is full.
struct moe_routing {
  static constexpr std::size_t dropped = static_cast<std::size_t>(-1);
  std::vector<std::size_t> experts;
  std::vector<std::size_t> slots;
};

template <class T>
[[nodiscard]] moe_routing route_top2(const T* probs, std::size_t tokens, std::size_t experts,
                                     std::size_t capacity) {
  moe_routing r;
  r.experts.resize(2 * tokens);
  r.slots.assign(2 * tokens, moe_routing::dropped);
  for (std::size_t t = 0; t < tokens; ++t) {
    const T* p = probs + t * experts;
    std::size_t e1 = 0;
    for (std::size_t e = 1; e < experts; ++e)
      if (p[e] > p[e1])
        e1 = e;
    std::size_t e2 = e1 == 0 ? 1 : 0;
    for (std::size_t e = 0; e < experts; ++e)
      if (e != e1 && p[e] > p[e2])
        e2 = e;
    r.experts[2 * t] = e1;
    r.experts[2 * t + 1] = e2;
  }
  std::vector<std::size_t> fill(experts, 0);
  for (std::size_t choice = 0; choice < 2; ++choice)
    for (std::size_t t = 0; t < tokens; ++t) {
      const std::size_t e = r.experts[2 * t + choice];
      if (fill[e] < capacity)
        r.slots[2 * t + choice] = fill[e]++;
    }
  return r;
}

/// The output shape of node `n` given the graph's earlier nodes; throws `shape_error` naming the
/// node when the inputs do not fit the op.
[[nodiscard]] inline hspmd::shape infer_shape(const graph& g, const node& n) {
  using detail::need_inputs;
  using detail::shape_fail;
  const auto in = [&](std::size_t i) -> const hspmd::shape& { return g[n.inputs.at(i)].out; };
  hspmd::shape out;
  switch (n.kind) {
  case op::input:
  case op::parameter:
    return n.out; // given by the tracer
  case op::matmul:
  case op::linear: {
    need_inputs(n, n.kind == op::linear ? 3 : 2);
    const auto& a = in(0);
    const auto& w = in(1);
    if (a.rank() < 2 || w.rank() != 2 || a.dims.back() != w.dims[0])
      shape_fail(n, "cannot multiply " + a.to_string() + " by " + w.to_string(),
                 "(..., m, k) by (k, n)");
    if (n.kind == op::linear && (in(2).rank() != 1 || in(2).dims[0] != w.dims[1]))
      shape_fail(n, "bias " + in(2).to_string() + " for " + std::to_string(w.dims[1]) + " outputs",
                 "a bias of shape (n)");
    out = a;
    out.dims.back() = w.dims[1];
    return out;
  }
  case op::batched_matmul: {
    need_inputs(n, 2);
    const auto& a = in(0);
    const auto& b = in(1);
    const std::size_t r = a.rank();
    const bool bt = n.attrs.flag;
    if (r < 3 || b.rank() != r || !std::equal(a.dims.begin(), a.dims.end() - 2, b.dims.begin()) ||
        a.dims[r - 1] != (bt ? b.dims[r - 1] : b.dims[r - 2]))
      shape_fail(n,
                 "cannot batch-multiply " + a.to_string() + " by " + b.to_string() +
                     (bt ? " transposed" : ""),
                 "(b..., m, k) by (b..., k, n), or by (b..., n, k) transposed");
    out = a;
    out.dims[r - 1] = bt ? b.dims[r - 2] : b.dims[r - 1];
    return out;
  }
  case op::add:
  case op::sub:
  case op::mul:
    need_inputs(n, 2);
    return detail::broadcast(n, in(0), in(1));
  case op::scale:
  case op::relu:
  case op::gelu:
  case op::tanh:
  case op::sigmoid:
  case op::softmax:
  case op::log_softmax:
  case op::dropout:
    need_inputs(n, 1);
    if ((n.kind == op::softmax || n.kind == op::log_softmax) && in(0).rank() == 0)
      shape_fail(n, "a scalar has no last dimension", "apply it to a tensor");
    if (n.kind == op::softmax && n.attrs.flag &&
        (in(0).rank() < 2 || in(0).dims[in(0).rank() - 1] != in(0).dims[in(0).rank() - 2]))
      shape_fail(n, "a causal softmax of " + in(0).to_string(), "scores of shape (..., S, S)");
    if (n.kind == op::dropout && !(n.attrs.scalar >= 0.0 && n.attrs.scalar < 1.0))
      shape_fail(n, "dropout probability " + std::to_string(n.attrs.scalar), "0 <= p < 1");
    return in(0);
  case op::conv2d: {
    need_inputs(n, 3);
    const auto& x = in(0);
    const auto& w = in(1);
    const bool ok_attrs = n.attrs.dims.size() == 2 && n.attrs.dims[0] > 0;
    if (x.rank() != 4 || w.rank() != 4 || !ok_attrs || w.dims[1] != x.dims[1] ||
        in(2).dims != std::vector<std::size_t>{w.dims[0]} ||
        x.dims[2] + 2 * (ok_attrs ? n.attrs.dims[1] : 0) < w.dims[2] ||
        x.dims[3] + 2 * (ok_attrs ? n.attrs.dims[1] : 0) < w.dims[3])
      shape_fail(n, "cannot convolve " + x.to_string() + " with " + w.to_string(),
                 "x (N, C, H, W), weight (K, C, R, S) no larger than the padded image, bias (K), "
                 "attrs {stride > 0, padding}");
    const std::size_t stride = n.attrs.dims[0];
    const std::size_t pad = n.attrs.dims[1];
    out = x;
    out.dims[1] = w.dims[0];
    out.dims[2] = (x.dims[2] + 2 * pad - w.dims[2]) / stride + 1;
    out.dims[3] = (x.dims[3] + 2 * pad - w.dims[3]) / stride + 1;
    return out;
  }
  case op::max_pool2d: {
    need_inputs(n, 1);
    const auto& x = in(0);
    if (x.rank() != 4 || n.attrs.dims.size() != 2 || n.attrs.dims[0] == 0 || n.attrs.dims[1] == 0 ||
        x.dims[2] < n.attrs.dims[0] || x.dims[3] < n.attrs.dims[0])
      shape_fail(n, "cannot pool " + x.to_string(),
                 "x (N, C, H, W) at least one kernel wide, attrs {kernel, stride} > 0");
    out = x;
    out.dims[2] = (x.dims[2] - n.attrs.dims[0]) / n.attrs.dims[1] + 1;
    out.dims[3] = (x.dims[3] - n.attrs.dims[0]) / n.attrs.dims[1] + 1;
    return out;
  }
  case op::adaptive_avg_pool2d: {
    need_inputs(n, 1);
    const auto& x = in(0);
    if (x.rank() != 4 || n.attrs.dims.size() != 2 || n.attrs.dims[0] == 0 || n.attrs.dims[1] == 0)
      shape_fail(n, "cannot pool " + x.to_string(), "x (N, C, H, W) and attrs {Ho, Wo} > 0");
    out = x;
    out.dims[2] = n.attrs.dims[0];
    out.dims[3] = n.attrs.dims[1];
    return out;
  }
  case op::broadcast: {
    need_inputs(n, 1);
    hspmd::shape target;
    target.dims = n.attrs.dims;
    out = detail::broadcast(n, in(0), target);
    if (out.dims != target.dims)
      shape_fail(n, "cannot broadcast " + in(0).to_string() + " to " + target.to_string(),
                 "a target whose trailing dimensions match or are 1 in the input");
    if (n.attrs.flag) // the target's outermost dimension is the batch
      out.batch_dim = 0;
    return out;
  }
  case op::moe_dispatch: {
    need_inputs(n, 2);
    const auto& x = in(0);
    const auto& p = in(1);
    if (x.rank() != 2 || p.rank() != 2 || p.dims[0] != x.dims[0] || p.dims[1] < 2 ||
        n.attrs.dims.size() != 1 || n.attrs.dims[0] == 0)
      shape_fail(n, "tokens " + x.to_string() + " and gate probabilities " + p.to_string(),
                 "tokens (T, H), probabilities (T, E) with E >= 2, attrs {capacity > 0}");
    out.dims = {p.dims[1], n.attrs.dims[0], x.dims[1]};
    return out;
  }
  case op::moe_combine: {
    need_inputs(n, 2);
    const auto& e = in(0);
    const auto& p = in(1);
    if (e.rank() != 3 || p.rank() != 2 || p.dims[1] != e.dims[0])
      shape_fail(n, "expert outputs " + e.to_string() + " and gate probabilities " + p.to_string(),
                 "expert outputs (E, C, H) and probabilities (T, E)");
    out.dims = {p.dims[0], e.dims[2]};
    out.batch_dim = p.batch_dim;
    return out;
  }
  case op::slice: {
    need_inputs(n, 1);
    const auto& x = in(0);
    if (n.attrs.dims.size() != 3 || n.attrs.dims[0] >= x.rank() ||
        n.attrs.dims[1] + n.attrs.dims[2] > x.dims[n.attrs.dims[0]])
      shape_fail(n,
                 "slice {axis, start, length} " + std::to_string(n.attrs.dims.size()) +
                     " values of " + x.to_string(),
                 "an axis of the input and start + length within it");
    out = x;
    out.dims[n.attrs.dims[0]] = n.attrs.dims[2];
    return out;
  }
  case op::concat: {
    if (n.inputs.empty() || n.attrs.dims.size() != 1 || n.attrs.dims[0] >= in(0).rank())
      shape_fail(n, "concat of " + std::to_string(n.inputs.size()) + " inputs",
                 "at least one input and attrs.dims = {axis}");
    const std::size_t axis = n.attrs.dims[0];
    out = in(0);
    out.dims[axis] = 0;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      auto a = in(i);
      if (a.rank() != out.rank())
        shape_fail(n, "ranks differ: " + in(0).to_string() + " and " + a.to_string(),
                   "equal ranks");
      out.dims[axis] += a.dims[axis];
      a.dims[axis] = in(0).dims[axis];
      if (a.dims != in(0).dims)
        shape_fail(n,
                   "shapes differ off the axis: " + in(0).to_string() + " and " + in(i).to_string(),
                   "equal sizes in every other dimension");
    }
    return out;
  }
  case op::layer_norm: {
    need_inputs(n, 3);
    const auto& x = in(0);
    if (x.rank() == 0 || in(1).dims != std::vector<std::size_t>{x.dims.back()} ||
        in(2).dims != std::vector<std::size_t>{x.dims.back()})
      shape_fail(n,
                 "gamma " + in(1).to_string() + " and beta " + in(2).to_string() + " for " +
                     x.to_string(),
                 "gamma and beta of shape (last dimension)");
    return x;
  }
  case op::embedding: {
    need_inputs(n, 2);
    const auto& table = in(0);
    if (table.rank() != 2)
      shape_fail(n, "table " + table.to_string(), "a (vocabulary, hidden) table");
    out = in(1);
    out.dims.push_back(table.dims[1]);
    return out;
  }
  case op::cross_entropy: {
    need_inputs(n, 2);
    const auto& logits = in(0);
    if (logits.rank() != 2 || in(1).rank() != 1 || in(1).dims[0] != logits.dims[0])
      shape_fail(n, "logits " + logits.to_string() + " and targets " + in(1).to_string(),
                 "logits (N, V) and targets (N)");
    return {};
  }
  case op::sum:
  case op::mean:
    need_inputs(n, 1);
    return {};
  case op::reshape: {
    need_inputs(n, 1);
    const auto& x = in(0);
    out.dims = n.attrs.dims;
    if (out.size() != x.size() || out.rank() == 0)
      shape_fail(n, "cannot reshape " + x.to_string() + " to " + out.to_string(),
                 "the same number of elements");
    // The batch stays the outermost dimension when rows are only merged or split within it.
    if (x.batch_dim == 0 && (out.dims[0] == x.dims[0] || out.dims[0] % x.dims[0] == 0))
      out.batch_dim = 0;
    return out;
  }
  case op::permute: {
    need_inputs(n, 1);
    const auto& x = in(0);
    std::vector<bool> seen(x.rank(), false);
    if (n.attrs.dims.size() != x.rank())
      shape_fail(n,
                 "permutation of " + std::to_string(n.attrs.dims.size()) + " dimensions for " +
                     x.to_string(),
                 "one entry per dimension");
    out.dims.resize(x.rank());
    for (std::size_t i = 0; i < x.rank(); ++i) {
      const std::size_t from = n.attrs.dims[i];
      if (from >= x.rank() || seen[from])
        shape_fail(n, "invalid permutation", "each dimension exactly once");
      seen[from] = true;
      out.dims[i] = x.dims[from];
      if (x.batch_dim == from)
        out.batch_dim = i;
    }
    return out;
  }
  }
  shape_fail(n, "unknown op", "an op of graph::op");
}

/// Forward and backward cost of one node (see the table at the top of this file).
struct node_cost {
  double forward_flops = 0.0;
  double backward_flops = 0.0;
  double forward_bytes = 0.0;
  double backward_bytes = 0.0;
};

/// The cost of node `id` of `g`.
[[nodiscard]] inline node_cost cost_of(const graph& g, node_id id) {
  const node& n = g[id];
  const auto size = [&](std::size_t i) {
    return static_cast<double>(g[n.inputs.at(i)].out.size());
  };
  const double out = static_cast<double>(n.out.size());
  const double es = static_cast<double>(size_of(n.type));
  node_cost c;
  double in_elems = 0.0;
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    in_elems += size(i);
  // Default bytes: read the inputs, write the output; backward reads the output gradient and the
  // inputs, writes one gradient per input.
  c.forward_bytes = (in_elems + out) * es;
  c.backward_bytes = (out + 2.0 * in_elems) * es;
  switch (n.kind) {
  case op::input:
  case op::parameter:
    return {};
  case op::matmul:
  case op::linear: {
    const auto& a = g[n.inputs[0]].out;
    const auto& w = g[n.inputs[1]].out;
    const double m = static_cast<double>(detail::rows_of(a));
    const double k = static_cast<double>(w.dims[0]);
    const double nn = static_cast<double>(w.dims[1]);
    c.forward_flops = 2.0 * m * k * nn;
    c.backward_flops = 4.0 * m * k * nn;
    if (n.kind == op::linear) {
      c.forward_flops += m * nn;
      c.backward_flops += m * nn;
    }
    return c;
  }
  case op::batched_matmul: {
    const auto& a = g[n.inputs[0]].out;
    const std::size_t r = a.rank();
    const double k = static_cast<double>(a.dims[r - 1]);
    c.forward_flops = 2.0 * out * k; // out = b * m * n
    c.backward_flops = 4.0 * out * k;
    return c;
  }
  case op::add:
  case op::sub:
    c.forward_flops = out;
    c.backward_flops = out; // sub negates; broadcast gradients are summed (<= out additions)
    return c;
  case op::mul:
    c.forward_flops = out;
    c.backward_flops = 2.0 * out;
    return c;
  case op::scale:
  case op::relu:
    c.forward_flops = out;
    c.backward_flops = out;
    return c;
  case op::gelu:
    c.forward_flops = 6.0 * out;
    c.backward_flops = 9.0 * out;
    return c;
  case op::tanh:
    c.forward_flops = out;
    c.backward_flops = 3.0 * out;
    return c;
  case op::sigmoid:
    c.forward_flops = 3.0 * out;
    c.backward_flops = 3.0 * out;
    return c;
  case op::softmax:
  case op::log_softmax:
    c.forward_flops = 5.0 * out;
    c.backward_flops = 4.0 * out;
    return c;
  case op::layer_norm:
    c.forward_flops = 8.0 * out;
    c.backward_flops = 15.0 * out;
    return c;
  case op::embedding:
    c.forward_flops = 0.0;
    c.backward_flops = out; // scatter-add of the output gradient into the table gradient
    c.forward_bytes = (2.0 * out + size(1)) * es;
    c.backward_bytes = (2.0 * out + size(1)) * es + size(0) * es;
    return c;
  case op::cross_entropy: {
    const auto& logits = g[n.inputs[0]].out;
    const double rows = static_cast<double>(logits.dims[0]);
    const double v = static_cast<double>(logits.dims[1]);
    c.forward_flops = 5.0 * v * rows + rows;
    c.backward_flops = 3.0 * v * rows;
    return c;
  }
  case op::sum:
    c.forward_flops = size(0);
    c.backward_flops = size(0);
    return c;
  case op::mean:
    c.forward_flops = size(0) + 1.0;
    c.backward_flops = size(0);
    return c;
  case op::reshape:
    return {}; // a view
  case op::permute:
  case op::slice:
  case op::concat:
    c.backward_bytes = 2.0 * out * es;
    return c;
  case op::dropout:
    c.forward_flops = 2.0 * out;
    c.backward_flops = out;
    return c;
  case op::conv2d: {
    const auto& w = g[n.inputs[1]].out;
    const double per_output = static_cast<double>(w.dims[1] * w.dims[2] * w.dims[3]); // C R S
    c.forward_flops = 2.0 * out * per_output + out;
    c.backward_flops = 4.0 * out * per_output + out;
    return c;
  }
  case op::broadcast:
    c.backward_flops = out;
    return c;
  case op::moe_dispatch:
    c.forward_flops = size(1); // the top-2 search over (T, E)
    return c;
  case op::moe_combine: {
    const double tokens = static_cast<double>(n.out.dims[0]);
    c.forward_flops = 4.0 * out;
    c.backward_flops = 4.0 * out + 8.0 * tokens;
    return c;
  }
  case op::max_pool2d: {
    const double k = static_cast<double>(n.attrs.dims[0]);
    c.forward_flops = out * (k * k - 1.0);
    c.backward_flops = out;
    return c;
  }
  case op::adaptive_avg_pool2d: {
    const auto& x = g[n.inputs[0]].out;
    double window_elems = 0.0; // sum over output cells of their window sizes
    for (std::size_t i = 0; i < n.out.dims[2]; ++i)
      for (std::size_t j = 0; j < n.out.dims[3]; ++j)
        window_elems += static_cast<double>((detail::pool_end(i, x.dims[2], n.out.dims[2]) -
                                             detail::pool_begin(i, x.dims[2], n.out.dims[2])) *
                                            (detail::pool_end(j, x.dims[3], n.out.dims[3]) -
                                             detail::pool_begin(j, x.dims[3], n.out.dims[3])));
    const double planes = static_cast<double>(x.dims[0] * x.dims[1]);
    c.forward_flops = planes * window_elems + out;
    c.backward_flops = planes * window_elems + out;
    return c;
  }
  }
  return c;
}

/// Sums of `cost_of` over all nodes.
[[nodiscard]] inline node_cost total_cost(const graph& g) {
  node_cost t;
  for (node_id i = 0; i < g.size(); ++i) {
    const node_cost c = cost_of(g, i);
    t.forward_flops += c.forward_flops;
    t.backward_flops += c.backward_flops;
    t.forward_bytes += c.forward_bytes;
    t.backward_bytes += c.backward_bytes;
  }
  return t;
}

} // namespace hspmd::graph
