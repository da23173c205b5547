#pragma once
// The vocabulary of placement rules, shared by the op registry (each op states its signature in
// graph/ops/<family>.hpp) and the rule engine (graph/rules.hpp derives rules from signatures).
// Everything here is constexpr: the typed ops of nn/ evaluate it at compile time.
//
// An op is described by a *signature* in einsum style: every dimension of every operand and of
// the output carries a label; equal labels are the same index. See graph/rules.hpp for the rules
// a signature yields and a worked example.

#include <hspmd/core/placement.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>

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
  bool hand_written = false;       ///< the op lists its rules itself (`op_traits::rules`)
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

/// A rule with every operand and the output replicated.
[[nodiscard]] constexpr rule replicated_rule(std::size_t arity) {
  rule r;
  r.arity = arity;
  return r; // every placement defaults to replicated
}

/// What an op's `op_traits::signature` builds its signature with: the operands' and the
/// output's static shapes, the node's attributes, and helpers that hand out labels.
class signature_builder {
public:
  constexpr signature_builder(std::span<const dims_view> ins, const dims_view& out,
                              std::span<const std::size_t> attr_dims, bool flag)
      : ins_(ins), out_(out), attr_dims_(attr_dims), flag_(flag) {
    s_.arity = std::min(ins.size(), max_operands);
  }

  [[nodiscard]] constexpr const dims_view& in(std::size_t k) const { return ins_[k]; }
  [[nodiscard]] constexpr const dims_view& out() const { return out_; }
  [[nodiscard]] constexpr std::size_t arity() const { return s_.arity; }
  [[nodiscard]] constexpr std::span<const std::size_t> attr_dims() const { return attr_dims_; }
  [[nodiscard]] constexpr bool flag() const { return flag_; }
  /// The signature being built (labels of operands and output, linearity, ...).
  [[nodiscard]] constexpr signature& sig() { return s_; }
  /// The index of the last dimension of a shape (0 for a scalar).
  [[nodiscard]] static constexpr std::size_t last(const dims_view& v) {
    return v.rank == 0 ? 0 : v.rank - 1;
  }

  /// A new label for a dimension of `extent`; splittable unless `can_split` is false or the
  /// extent is below 2.
  constexpr label make(std::size_t extent, bool can_split = true) {
    const label l = next_++;
    if (can_split && extent >= 2 && l < 32)
      s_.splittable |= std::uint32_t{1} << l;
    return l;
  }
  /// Label `l` may not be split (a normalized axis, the axis of a slice).
  constexpr void forbid(label l) {
    if (l < 32)
      s_.splittable &= ~(std::uint32_t{1} << l);
  }
  /// Label `l` is summed over: splitting it gives a partial output.
  constexpr void sum_over(label l) {
    if (l < 32)
      s_.summed |= std::uint32_t{1} << l;
  }
  /// The op is linear in the operands of `mask` (joint: in all together; each: in one at a time).
  constexpr void linear_in(signature::linearity how, std::uint8_t mask) {
    s_.linear = how;
    s_.linear_in = mask;
  }

  /// Fresh labels for every dimension of operand k.
  constexpr void fresh(std::size_t k, bool can_split = true) {
    s_.in_rank[k] = ins_[k].rank;
    for (std::size_t i = 0; i < ins_[k].rank; ++i)
      s_.in[k][i] = make(ins_[k][i], can_split);
  }
  /// Operand k's dimensions given explicitly (rank = labels.size()).
  constexpr void set_in(std::size_t k, std::initializer_list<label> labels) {
    s_.in_rank[k] = labels.size();
    std::size_t i = 0;
    for (label l : labels)
      s_.in[k][i++] = l;
  }
  /// The output's dimensions given explicitly.
  constexpr void set_out(std::initializer_list<label> labels) {
    s_.out_rank = labels.size();
    std::size_t i = 0;
    for (label l : labels)
      s_.out[i++] = l;
  }
  /// The output is labelled like operand k (elementwise ops).
  constexpr void same_as_input(std::size_t k) {
    s_.out_rank = out_.rank;
    for (std::size_t i = 0; i < out_.rank; ++i)
      s_.out[i] = s_.in[k][i];
  }

  /// Output labels fresh; each operand aligned to the output's trailing dimensions, numpy-style;
  /// an operand dimension of size 1 under a larger output dimension gets its own, unsplittable,
  /// label (the operand is replicated along it).
  constexpr void broadcasting() {
    s_.out_rank = out_.rank;
    for (std::size_t i = 0; i < out_.rank; ++i)
      s_.out[i] = make(out_[i]);
    for (std::size_t k = 0; k < s_.arity; ++k) {
      const dims_view& x = ins_[k];
      s_.in_rank[k] = x.rank;
      for (std::size_t i = 0; i < x.rank; ++i) {
        const std::size_t o = out_.rank - x.rank + i;
        s_.in[k][i] = x[i] == out_[o] ? s_.out[o] : make(x[i], false);
      }
    }
  }

  /// Reshape: dimensions group into runs with equal products on both sides ((B, S, H) ->
  /// (B*S, H): {B, S} | {B*S}, {H} | {H}). The leading dimensions of a group share a label (a
  /// contiguous range of B is a contiguous range of B*S, in units of S); inner dimensions get
  /// their own, unsplittable labels. Dimensions of size 1 stand alone.
  constexpr void reshape_groups() {
    const dims_view& in = ins_[0];
    s_.in_rank[0] = in.rank;
    s_.out_rank = out_.rank;
    std::size_t i = 0;
    std::size_t o = 0;
    while (i < in.rank || o < out_.rank) {
      if (i < in.rank && in[i] == 1) {
        s_.in[0][i++] = make(1);
        continue;
      }
      if (o < out_.rank && out_[o] == 1) {
        s_.out[o++] = make(1);
        continue;
      }
      if (i >= in.rank || o >= out_.rank) { // shapes disagree: nothing splittable beyond
        for (; i < in.rank; ++i)
          s_.in[0][i] = make(in[i], false);
        for (; o < out_.rank; ++o)
          s_.out[o] = make(out_[o], false);
        break;
      }
      const std::size_t i0 = i;
      const std::size_t o0 = o;
      std::size_t pi = in[i++];
      std::size_t po = out_[o++];
      while (pi != po) {
        if (pi < po && i < in.rank)
          pi *= in[i++];
        else if (po < pi && o < out_.rank)
          po *= out_[o++];
        else
          break;
      }
      const label lead = make(std::min(in[i0], out_[o0]));
      s_.in[0][i0] = lead;
      s_.out[o0] = lead;
      for (std::size_t k = i0 + 1; k < i; ++k)
        s_.in[0][k] = make(in[k], false);
      for (std::size_t k = o0 + 1; k < o; ++k)
        s_.out[k] = make(out_[k], false);
    }
  }

private:
  signature s_;
  std::span<const dims_view> ins_;
  dims_view out_;
  std::span<const std::size_t> attr_dims_;
  bool flag_ = false;
  label next_ = 0;
};

} // namespace hspmd::graph
