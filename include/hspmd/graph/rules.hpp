#pragma once
// Placement rules of every op: the input placements under which an op runs locally on every
// rank, without communication, and the placement of its output. One table, used at run time by
// the synthesizer and at compile time by the typed ops of nn/ (everything here is constexpr).
//
// An op is described by a *signature* in einsum style: every dimension of every operand and of
// the output carries a label; equal labels are the same index. From the signature:
//   - split rule, one per splittable label L: operands that have L are split along it, the
//     others replicated; the output is split along L, or `partial` when L is summed over
//     (absent from the output: matmul's k, the rows of a summed cross-entropy, a vocabulary
//     lookup). Every rank computes its share of the op (work proportional to its ratio).
//   - linear rules: an op linear in an operand maps a partial operand (the others replicated)
//     to a partial output. Every rank computes the whole shape.
//   - the all-replicated fallback: every rank computes everything.
// Not splittable: dimensions of size 1, the axis of a softmax / layer norm, spatial dimensions
// of convolutions and pooling (they would need halos), the axis of a slice or concat, and the
// inner dimensions of a reshape group (see `reshape`).
// Two ops have hand-written rules: moe_dispatch / moe_combine (expert and token parallelism).
//
// Worked example: linear x (B, 768) . W (768, 3072) + b (3072), labels x [i k], W [k n],
// b [n], y [i n]:
//   split i (data parallel)    : x split(0), W replicated, b replicated -> y split(0)
//   split k (row parallel)     : x split(1), W split(0),   b replicated -> y partial, b added once
//   split n (column parallel)  : x replicated, W split(1), b split(0)   -> y split(1)
//   linear in x                : x partial, W replicated, b replicated  -> y partial, b added once
//   fallback                   : all replicated                          -> y replicated

#include <hspmd/core/placement.hpp>
#include <hspmd/graph/ir.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace hspmd::graph {

inline constexpr std::size_t max_rank = 8;     ///< dimensions of a tensor the rules handle
inline constexpr std::size_t max_operands = 8; ///< inputs of one node the rules handle
inline constexpr std::size_t max_rules = 24;   ///< rules of one node

/// Placements as small codes, for bit masks and types: 0 replicated, 1 partial, 2 + d split(d).
inline constexpr std::size_t placement_codes = 2 + max_rank;
[[nodiscard]] constexpr std::uint8_t code_of(placement p) noexcept {
  return p.is_replicated() ? 0 : p.is_partial() ? 1 : static_cast<std::uint8_t>(2 + p.dim());
}
[[nodiscard]] constexpr placement placement_of_code(std::size_t c) noexcept {
  return c == 0 ? placement{} : c == 1 ? placement{partial{}} : placement::split_along(c - 2);
}

/// A shape without the heap, for constant evaluation.
struct dims_view {
  std::array<std::size_t, max_rank> d{};
  std::size_t rank = 0;

  [[nodiscard]] constexpr std::size_t operator[](std::size_t i) const { return d.at(i); }
  [[nodiscard]] static constexpr dims_view of(std::span<const std::size_t> dims) {
    dims_view v;
    v.rank = std::min(dims.size(), max_rank);
    for (std::size_t i = 0; i < v.rank; ++i)
      v.d[i] = dims[i];
    return v;
  }
};

using label = std::uint8_t;
inline constexpr label no_label = 0xFF;

/// The einsum-style description of one node (see the file comment).
struct signature {
  std::size_t arity = 0;
  std::array<std::array<label, max_rank>, max_operands> in{};
  std::array<std::size_t, max_operands> in_rank{};
  std::array<label, max_rank> out{};
  std::size_t out_rank = 0;
  std::uint32_t splittable = 0; ///< labels that may be split
  std::uint32_t summed = 0;     ///< labels summed over: a split gives a partial output
  /// Linear rules: `joint`: partial in all of `linear_in` together (add: a + b); `each`: partial
  /// in one of them, the others replicated (matmul: A . B).
  enum class linearity : std::uint8_t { none, joint, each } linear = linearity::none;
  std::uint8_t linear_in = 0;      ///< bitmask of operands
  std::optional<std::size_t> bias; ///< operand added once per output element (linear, conv2d)
  label vocabulary = no_label;     ///< cross-entropy: split with two row all-reduces
  bool hand_written = false;       ///< moe_dispatch / moe_combine: rules listed by hand
  bool known = true;               ///< false for input / parameter (loaded, not computed)
};

/// One way to run a node locally.
struct rule {
  std::array<placement, max_operands> in{};
  std::size_t arity = 0;
  placement out = replicated{};
  bool split_work = false;     ///< each rank computes its share; otherwise all of the op
  bool bias_once = false;      ///< the bias (operand `signature::bias`) is added by one rank only
  bool vocab_parallel = false; ///< cross-entropy: per-row max and sum are all-reduced
  enum class family : std::uint8_t { replicated, split, linear, expert } kind = family::replicated;

  [[nodiscard]] constexpr std::span<const placement> inputs() const noexcept {
    return {in.data(), arity};
  }
  friend constexpr bool operator==(const rule&, const rule&) noexcept = default;
};

/// The rules of one node, at most `max_rules`.
struct rule_list {
  std::array<rule, max_rules> items{};
  std::size_t size = 0;

  constexpr void push(const rule& r) {
    for (std::size_t i = 0; i < size; ++i)
      if (items[i].inputs().size() == r.arity &&
          std::equal(r.in.begin(), r.in.begin() + static_cast<std::ptrdiff_t>(r.arity),
                     items[i].in.begin()) &&
          items[i].out == r.out)
        return; // the same placements twice (e.g. a label that two routes reach)
    if (size < max_rules)
      items[size++] = r;
  }
  [[nodiscard]] constexpr const rule* begin() const noexcept { return items.data(); }
  [[nodiscard]] constexpr const rule* end() const noexcept { return items.data() + size; }
};

namespace detail {

struct label_maker {
  label next = 0;
  std::uint32_t splittable = 0;
  constexpr label make(std::size_t extent, bool can_split = true) {
    const label l = next++;
    if (can_split && extent >= 2 && l < 32)
      splittable |= std::uint32_t{1} << l;
    return l;
  }
};

[[nodiscard]] constexpr bool has(std::uint32_t mask, label l) noexcept {
  return l < 32 && ((mask >> l) & 1U) != 0;
}

constexpr void fresh(signature& s, label_maker& m, std::size_t operand, const dims_view& x,
                     bool can_split = true) {
  s.in_rank[operand] = x.rank;
  for (std::size_t i = 0; i < x.rank; ++i)
    s.in[operand][i] = m.make(x[i], can_split);
}

constexpr void same_as_input(signature& s, std::size_t operand, const dims_view& out) {
  s.out_rank = out.rank;
  for (std::size_t i = 0; i < out.rank; ++i)
    s.out[i] = s.in[operand][i];
}

// Output labels fresh; each operand aligned to the output's trailing dimensions, numpy-style;
// an operand dimension of size 1 under a larger output dimension gets its own, unsplittable,
// label (the operand is replicated along it).
constexpr void broadcasting(signature& s, label_maker& m, std::span<const dims_view> ins,
                            const dims_view& out) {
  s.out_rank = out.rank;
  for (std::size_t i = 0; i < out.rank; ++i)
    s.out[i] = m.make(out[i]);
  for (std::size_t k = 0; k < ins.size(); ++k) {
    const dims_view& x = ins[k];
    s.in_rank[k] = x.rank;
    for (std::size_t i = 0; i < x.rank; ++i) {
      const std::size_t o = out.rank - x.rank + i;
      s.in[k][i] = x[i] == out[o] ? s.out[o] : m.make(x[i], false);
    }
  }
}

constexpr void forbid(signature& s, label l) {
  if (l < 32)
    s.splittable &= ~(std::uint32_t{1} << l);
}

// Reshape: dimensions group into runs with equal products on both sides ((B, S, H) -> (B*S, H):
// {B, S} | {B*S}, {H} | {H}). The leading dimensions of a group share a label (a contiguous
// range of B is a contiguous range of B*S, in units of S); inner dimensions get their own,
// unsplittable labels. Dimensions of size 1 stand alone.
constexpr void reshape_labels(signature& s, label_maker& m, const dims_view& in,
                              const dims_view& out) {
  s.in_rank[0] = in.rank;
  s.out_rank = out.rank;
  std::size_t i = 0;
  std::size_t o = 0;
  while (i < in.rank || o < out.rank) {
    if (i < in.rank && in[i] == 1) {
      s.in[0][i++] = m.make(1);
      continue;
    }
    if (o < out.rank && out[o] == 1) {
      s.out[o++] = m.make(1);
      continue;
    }
    if (i >= in.rank || o >= out.rank) { // shapes disagree: nothing splittable beyond
      for (; i < in.rank; ++i)
        s.in[0][i] = m.make(in[i], false);
      for (; o < out.rank; ++o)
        s.out[o] = m.make(out[o], false);
      break;
    }
    const std::size_t i0 = i;
    const std::size_t o0 = o;
    std::size_t pi = in[i++];
    std::size_t po = out[o++];
    while (pi != po) {
      if (pi < po && i < in.rank)
        pi *= in[i++];
      else if (po < pi && o < out.rank)
        po *= out[o++];
      else
        break;
    }
    const label lead = m.make(std::min(in[i0], out[o0]));
    s.in[0][i0] = lead;
    s.out[o0] = lead;
    for (std::size_t k = i0 + 1; k < i; ++k)
      s.in[0][k] = m.make(in[k], false);
    for (std::size_t k = o0 + 1; k < o; ++k)
      s.out[k] = m.make(out[k], false);
  }
}

} // namespace detail

/// The signature of an op with inputs `ins` and output `out`. `attr_dims` and `flag` are the
/// node's attributes (permutation, slice / concat axis, transposed second operand).
[[nodiscard]] constexpr signature signature_of(op kind, std::span<const dims_view> ins,
                                               const dims_view& out,
                                               std::span<const std::size_t> attr_dims = {},
                                               bool flag = false) {
  signature s;
  s.arity = std::min(ins.size(), max_operands);
  detail::label_maker m;
  const auto last = [](const dims_view& v) { return v.rank == 0 ? 0 : v.rank - 1; };
  switch (kind) {
  case op::input:
  case op::parameter:
    s.known = false;
    return s;
  case op::relu:
  case op::gelu:
  case op::tanh:
  case op::sigmoid:
  case op::scale:
  case op::dropout:
  case op::softmax:
  case op::log_softmax:
    detail::fresh(s, m, 0, ins[0]);
    detail::same_as_input(s, 0, out);
    if (kind == op::scale || kind == op::dropout) {
      s.linear = signature::linearity::joint;
      s.linear_in = 1;
    }
    break;
  case op::add:
  case op::sub:
  case op::mul:
  case op::broadcast:
    detail::broadcasting(s, m, ins.first(s.arity), out);
    s.linear = kind == op::mul ? signature::linearity::each : signature::linearity::joint;
    s.linear_in = kind == op::broadcast ? 1 : 3;
    break;
  case op::layer_norm:
    detail::fresh(s, m, 0, ins[0]);
    detail::same_as_input(s, 0, out);
    for (std::size_t k = 1; k < s.arity; ++k) {
      s.in_rank[k] = 1;
      s.in[k][0] = s.in[0][last(ins[0])];
    }
    break;
  case op::matmul:
  case op::linear: {
    // x (..., m, k), w (k, n) [, b (n)] -> (..., m, n)
    detail::fresh(s, m, 0, ins[0]);
    const label k = s.in[0][last(ins[0])];
    const label n = m.make(ins[1][1]);
    s.in_rank[1] = 2;
    s.in[1][0] = k;
    s.in[1][1] = n;
    s.out_rank = out.rank;
    for (std::size_t i = 0; i + 1 < out.rank; ++i)
      s.out[i] = s.in[0][i];
    s.out[last(out)] = n;
    if (kind == op::linear && s.arity > 2) {
      s.in_rank[2] = 1;
      s.in[2][0] = n;
      s.bias = 2;
    }
    s.summed = std::uint32_t{1} << k;
    s.linear = signature::linearity::each;
    s.linear_in = kind == op::matmul ? 3 : 1;
    break;
  }
  case op::batched_matmul: {
    // a (b..., m, k), b (b..., k, n) or, transposed, (b..., n, k) -> (b..., m, n)
    detail::fresh(s, m, 0, ins[0]);
    const std::size_t r = ins[0].rank;
    const label k = s.in[0][r - 1];
    const label n = m.make(ins[1][flag ? r - 2 : r - 1]);
    s.in_rank[1] = r;
    for (std::size_t i = 0; i + 2 < r; ++i)
      s.in[1][i] = ins[1][i] == ins[0][i] ? s.in[0][i] : m.make(ins[1][i], false);
    s.in[1][r - 2] = flag ? n : k;
    s.in[1][r - 1] = flag ? k : n;
    s.out_rank = r;
    for (std::size_t i = 0; i + 1 < r; ++i)
      s.out[i] = s.in[0][i];
    s.out[r - 1] = n;
    s.summed = std::uint32_t{1} << k;
    s.linear = signature::linearity::each;
    s.linear_in = 3;
    break;
  }
  case op::embedding: {
    // table (V, H), ids (...) -> (..., H): a one-hot product, summed over V
    detail::fresh(s, m, 0, ins[0]);
    detail::fresh(s, m, 1, ins[1]);
    s.out_rank = out.rank;
    for (std::size_t i = 0; i < ins[1].rank; ++i)
      s.out[i] = s.in[1][i];
    s.out[last(out)] = s.in[0][1];
    s.summed = std::uint32_t{1} << s.in[0][0];
    s.linear = signature::linearity::each;
    s.linear_in = 1;
    break;
  }
  case op::cross_entropy:
    // logits (N, V), targets (N) -> (): summed over rows; the vocabulary splits with care
    detail::fresh(s, m, 0, ins[0]);
    s.in_rank[1] = 1;
    s.in[1][0] = s.in[0][0];
    s.out_rank = 0;
    s.summed = std::uint32_t{1} << s.in[0][0];
    s.vocabulary = s.in[0][1];
    break;
  case op::sum:
  case op::mean:
    detail::fresh(s, m, 0, ins[0]);
    s.out_rank = 0;
    for (std::size_t i = 0; i < ins[0].rank; ++i)
      s.summed |= std::uint32_t{1} << s.in[0][i];
    s.linear = signature::linearity::joint;
    s.linear_in = 1;
    break;
  case op::reshape:
    detail::reshape_labels(s, m, ins[0], out);
    s.linear = signature::linearity::joint;
    s.linear_in = 1;
    break;
  case op::permute:
    detail::fresh(s, m, 0, ins[0]);
    s.out_rank = out.rank;
    for (std::size_t i = 0; i < out.rank && i < attr_dims.size(); ++i)
      s.out[i] = s.in[0][attr_dims[i]];
    s.linear = signature::linearity::joint;
    s.linear_in = 1;
    break;
  case op::slice:
  case op::concat: {
    const std::size_t axis = attr_dims.empty() ? 0 : attr_dims[0];
    detail::fresh(s, m, 0, ins[0]);
    for (std::size_t k = 1; k < s.arity; ++k) {
      s.in_rank[k] = ins[k].rank;
      for (std::size_t i = 0; i < ins[k].rank; ++i)
        s.in[k][i] = i == axis ? m.make(ins[k][i], false) : s.in[0][i];
    }
    detail::same_as_input(s, 0, out);
    detail::forbid(s, s.in[0][axis]);
    s.out[axis] = m.make(out[axis], false);
    s.linear = signature::linearity::joint;
    s.linear_in = static_cast<std::uint8_t>((1U << s.arity) - 1U);
    break;
  }
  case op::conv2d: {
    // x (N, C, H, W), w (K, C, R, S), b (K) -> (N, K, Ho, Wo); C summed
    s.in_rank[0] = 4;
    s.in[0][0] = m.make(ins[0][0]);
    s.in[0][1] = m.make(ins[0][1]);
    s.in[0][2] = m.make(ins[0][2], false);
    s.in[0][3] = m.make(ins[0][3], false);
    const label kk = m.make(ins[1][0]);
    s.in_rank[1] = 4;
    s.in[1][0] = kk;
    s.in[1][1] = s.in[0][1];
    s.in[1][2] = m.make(ins[1][2], false);
    s.in[1][3] = m.make(ins[1][3], false);
    if (s.arity > 2) {
      s.in_rank[2] = 1;
      s.in[2][0] = kk;
      s.bias = 2;
    }
    s.out_rank = 4;
    s.out[0] = s.in[0][0];
    s.out[1] = kk;
    s.out[2] = m.make(out[2], false);
    s.out[3] = m.make(out[3], false);
    s.summed = std::uint32_t{1} << s.in[0][1];
    s.linear = signature::linearity::each;
    s.linear_in = 1;
    break;
  }
  case op::max_pool2d:
  case op::adaptive_avg_pool2d:
    s.in_rank[0] = 4;
    s.in[0][0] = m.make(ins[0][0]);
    s.in[0][1] = m.make(ins[0][1]);
    s.in[0][2] = m.make(ins[0][2], false);
    s.in[0][3] = m.make(ins[0][3], false);
    s.out_rank = 4;
    s.out[0] = s.in[0][0];
    s.out[1] = s.in[0][1];
    s.out[2] = m.make(out[2], false);
    s.out[3] = m.make(out[3], false);
    if (kind == op::adaptive_avg_pool2d) {
      s.linear = signature::linearity::joint;
      s.linear_in = 1;
    }
    break;
  case op::moe_dispatch:
  case op::moe_combine:
    s.hand_written = true;
    return s;
  }
  s.splittable = m.splittable;
  if (kind == op::softmax || kind == op::log_softmax || kind == op::layer_norm)
    detail::forbid(s, s.in[0][last(ins[0])]); // the normalized axis
  if (kind == op::slice || kind == op::concat)
    detail::forbid(s, s.in[0][attr_dims.empty() ? 0 : attr_dims[0]]);
  return s;
}

namespace detail {

[[nodiscard]] constexpr std::optional<std::size_t> find_label(const std::array<label, max_rank>& ls,
                                                              std::size_t rank, label l) {
  for (std::size_t i = 0; i < rank; ++i)
    if (ls[i] == l)
      return i;
  return std::nullopt;
}

constexpr rule replicated_rule(std::size_t arity) {
  rule r;
  r.arity = arity;
  return r; // every placement defaults to replicated
}

// moe_dispatch: tokens (T, H), probabilities (T, E) -> buffers (E, C, H).
// moe_combine : buffers (E, C, H), probabilities (T, E) -> tokens (T, H).
// Token parallel: each rank routes its own tokens into its share of the capacity (GShard's
// group-local capacity, with the ranks as groups). Hidden parallel: routing needs only the
// probabilities. Expert parallel (combine): each rank adds its experts' contributions.
constexpr void moe_rules(op kind, rule_list& out) {
  rule r = replicated_rule(2);
  out.push(r);
  r.split_work = true;
  r.kind = rule::family::split;
  if (kind == op::moe_dispatch) {
    r.in = {placement::split_along(0), placement::split_along(0)};
    r.out = placement::split_along(1);
    out.push(r);
    r.in = {placement::split_along(1), replicated{}};
    r.out = placement::split_along(2);
    out.push(r);
  } else {
    r.in = {placement::split_along(1), placement::split_along(0)};
    r.out = placement::split_along(0);
    out.push(r);
    r.in = {placement::split_along(2), replicated{}};
    r.out = placement::split_along(1);
    out.push(r);
    r.kind = rule::family::expert;
    r.in = {placement::split_along(0), replicated{}};
    r.out = partial{};
    out.push(r);
  }
}

} // namespace detail

/// Every rule of a node with signature `s`, in a fixed order: the fallback, the split rules by
/// label, the linear rules. `kind` is needed only for the hand-written ops.
[[nodiscard]] constexpr rule_list rules_of(const signature& s, op kind) {
  rule_list out;
  if (!s.known)
    return out;
  if (s.hand_written) {
    detail::moe_rules(kind, out);
    return out;
  }
  out.push(detail::replicated_rule(s.arity));
  for (label l = 0; l < 32; ++l) {
    const bool vocab = l == s.vocabulary;
    if (!detail::has(s.splittable, l))
      continue;
    rule r = detail::replicated_rule(s.arity);
    r.split_work = true;
    r.kind = rule::family::split;
    bool any = false;
    for (std::size_t k = 0; k < s.arity; ++k)
      if (const auto d = detail::find_label(s.in[k], s.in_rank[k], l)) {
        r.in[k] = placement::split_along(*d);
        any = true;
      }
    if (const auto d = detail::find_label(s.out, s.out_rank, l))
      r.out = placement::split_along(*d);
    else if (detail::has(s.summed, l) || vocab)
      r.out = partial{};
    else
      continue; // a label only in the output or nowhere: nothing to split
    if (!any && !r.out.is_split())
      continue;
    r.vocab_parallel = vocab;
    r.bias_once = s.bias && r.out.is_partial();
    out.push(r);
  }
  if (s.linear != signature::linearity::none) {
    rule r = detail::replicated_rule(s.arity);
    r.kind = rule::family::linear;
    r.out = partial{};
    r.bias_once = s.bias.has_value();
    if (s.linear == signature::linearity::joint) {
      for (std::size_t k = 0; k < s.arity; ++k)
        if (((s.linear_in >> k) & 1U) != 0)
          r.in[k] = partial{};
      out.push(r);
    } else {
      for (std::size_t k = 0; k < s.arity; ++k) {
        if (((s.linear_in >> k) & 1U) == 0)
          continue;
        rule one = r;
        one.in[k] = partial{};
        out.push(one);
      }
    }
  }
  return out;
}

/// The placement of an op's output when its inputs have placements `ins`, if a rule allows it.
[[nodiscard]] constexpr std::optional<placement> result_placement(const signature& s, op kind,
                                                                  std::span<const placement> ins) {
  for (const rule& r : rules_of(s, kind))
    if (r.arity == ins.size() && std::equal(ins.begin(), ins.end(), r.in.begin()))
      return r.out;
  return std::nullopt;
}

/// The signature of node `id` of `g` (runtime shapes).
[[nodiscard]] inline signature signature_of(const graph& g, node_id id) {
  const node& n = g[id];
  std::array<dims_view, max_operands> ins{};
  const std::size_t arity = std::min(n.inputs.size(), max_operands);
  for (std::size_t k = 0; k < arity; ++k)
    ins[k] = dims_view::of(g[n.inputs[k]].out.dims);
  return signature_of(n.kind, std::span<const dims_view>(ins.data(), arity),
                      dims_view::of(n.out.dims), n.attrs.dims, n.attrs.flag);
}

/// The rules of node `id` of `g`.
[[nodiscard]] inline rule_list rules_of(const graph& g, node_id id) {
  return rules_of(signature_of(g, id), g[id].kind);
}

} // namespace hspmd::graph

namespace hspmd::graph {

/// What pinned operand placements imply for an op's output (manual SPMD).
struct pin_outcome {
  enum class kind : std::uint8_t {
    unpinned, ///< no operand pinned, or the rules that fit leave the output open
    pinned,   ///< every rule that fits the pinned operands yields `out`
    no_rule,  ///< no rule runs the op locally on the pinned operands
  } what = kind::unpinned;
  placement out;
  bool has_fix = false;        ///< no_rule: redistributing one operand would help
  std::size_t fix_operand = 0; ///< ... this one
  placement fix;               ///< ... to this placement
};

namespace detail {
[[nodiscard]] constexpr bool fits_pins(const rule& r,
                                       std::span<const std::optional<placement>> pins) {
  for (std::size_t i = 0; i < pins.size() && i < r.arity; ++i)
    if (pins[i] && !(*pins[i] == r.in[i]))
      return false;
  return r.arity == pins.size();
}
} // namespace detail

/// The output placement an op must have when some operands are pinned: the placement every
/// fitting rule yields, or no rule (with the one-operand redistribution that would make one
/// fit, trying replicated first, then splits, then partial).
[[nodiscard]] constexpr pin_outcome propagate_pins(const signature& s, op kind,
                                                   std::span<const std::optional<placement>> pins) {
  pin_outcome o;
  bool any = false;
  for (const auto& p : pins)
    any = any || p.has_value();
  if (!any || !s.known)
    return o;
  const rule_list rules = rules_of(s, kind);
  bool found = false;
  bool same = true;
  for (const rule& r : rules)
    if (detail::fits_pins(r, pins)) {
      if (found && !(r.out == o.out))
        same = false;
      o.out = r.out;
      found = true;
    }
  if (found) {
    o.what = same ? pin_outcome::kind::pinned : pin_outcome::kind::unpinned;
    return o;
  }
  o.what = pin_outcome::kind::no_rule;
  for (std::size_t i = 0; i < pins.size() && !o.has_fix; ++i) {
    if (!pins[i])
      continue;
    std::array<std::optional<placement>, max_operands> trial{};
    for (std::size_t k = 0; k < pins.size(); ++k)
      trial[k] = pins[k];
    const std::size_t rank = s.in_rank[i];
    for (std::size_t c = 0; c < 2 + rank && !o.has_fix; ++c) {
      const placement cand = c == 0      ? placement{}
                             : c <= rank ? placement::split_along(c - 1)
                                         : placement{partial{}};
      trial[i] = cand;
      for (const rule& r : rules)
        if (detail::fits_pins(
                r, std::span<const std::optional<placement>>(trial.data(), pins.size()))) {
          o.has_fix = true;
          o.fix_operand = i;
          o.fix = cand;
          break;
        }
    }
  }
  return o;
}

} // namespace hspmd::graph
