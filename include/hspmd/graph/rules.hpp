#pragma once
// Placement rules of every op: the input placements under which an op runs locally on every
// rank, without communication, and the placement of its output. One table, used at run time by
// the synthesizer and at compile time by the typed ops of nn/ (everything here is constexpr).
//
// Each op states a *signature* in its registry entry (graph/ops/<family>.hpp) in einsum style:
// every dimension of every operand and of the output carries a label; equal labels are the same
// index (graph/signature.hpp). From the signature:
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
// Ops whose signature says `hand_written` list their rules in their entry (moe_dispatch and
// moe_combine: expert and token parallelism, graph/ops/moe.hpp).
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
#include <hspmd/graph/ops.hpp>
#include <hspmd/graph/signature.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace hspmd::graph {

namespace detail {

[[nodiscard]] constexpr std::optional<std::size_t> find_label(const std::array<label, max_rank>& ls,
                                                              std::size_t rank, label l) {
  for (std::size_t i = 0; i < rank; ++i)
    if (ls[i] == l)
      return i;
  return std::nullopt;
}

[[nodiscard]] constexpr bool has(std::uint32_t mask, label l) noexcept {
  return l < 32 && ((mask >> l) & 1U) != 0;
}

} // namespace detail

/// Every rule of a node with signature `s`, in a fixed order: the fallback, the split rules by
/// label, the linear rules. `kind` is needed only for the hand-written ops.
[[nodiscard]] constexpr rule_list rules_of(const signature& s, op kind) {
  rule_list out;
  if (!s.known)
    return out;
  if (s.hand_written) {
    hand_written_rules(kind, out);
    return out;
  }
  out.push(replicated_rule(s.arity));
  for (label l = 0; l < 32; ++l) {
    const bool vocab = l == s.vocabulary;
    if (!detail::has(s.splittable, l))
      continue;
    rule r = replicated_rule(s.arity);
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
    rule r = replicated_rule(s.arity);
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
