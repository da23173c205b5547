#pragma once
// Registry entries of top-2 mixture-of-experts routing: dispatch (tokens into per-expert
// buffers) and combine (expert outputs back to tokens, weighted by the renormalized gates).
// The routing itself (the same in both) is in kernels/moe.hpp.
//
//   op            forward FLOPs                      backward FLOPs
//   moe_dispatch  T E (top-2 search; copies bytes)   0 (copies back)
//   moe_combine   4 T H (two scaled adds per token)  4 T H + 8 T (gate gradients)
// (the experts' FFNs are batched matmuls of their own: 2 E C H F each way, C the capacity)
//
// Their placement rules are hand-written (no einsum signature expresses routing):
//   token parallel   each rank routes its own tokens into its share of the capacity (GShard's
//                    group-local capacity, with the ranks as groups)
//   hidden parallel  routing needs only the probabilities
//   expert parallel  (combine) each rank adds its experts' contributions: a partial output

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// tokens x (T, H), gate probabilities (T, E) -> expert buffers (E, C, H); C = attrs.dims[0].
template <>
struct op_traits<op::moe_dispatch> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "tokens (T, H), gate probabilities (T, E) -> expert buffers (E, attrs.dims[0], H)";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    const auto& p = v.in(1);
    const auto& a = v.attrs().dims;
    if (x.rank() != 2 || p.rank() != 2 || p.dims[0] != x.dims[0] || p.dims[1] < 2 ||
        a.size() != 1 || a[0] == 0)
      v.fail("tokens " + x.to_string() + " and gate probabilities " + p.to_string(),
             "tokens (T, H), probabilities (T, E) with E >= 2, attrs {capacity > 0}");
    hspmd::shape out;
    out.dims = {p.dims[1], a[0], x.dims[1]};
    return out;
  }
  static node_cost cost(const node_view& v) {
    node_cost c = v.memory_cost();
    c.forward_flops = v.in_size(1); // the top-2 search over (T, E)
    return c;
  }
  static constexpr void signature(signature_builder& b) { b.sig().hand_written = true; }
  static constexpr void rules(rule_list& out) {
    rule r = replicated_rule(2);
    out.push(r);
    r.split_work = true;
    r.kind = rule::family::split;
    r.in = {placement::split_along(0), placement::split_along(0)};
    r.out = placement::split_along(1);
    out.push(r);
    r.in = {placement::split_along(1), replicated{}};
    r.out = placement::split_along(2);
    out.push(r);
  }
  static std::vector<op_example> examples() {
    std::vector<op_example> e;
    for (const std::size_t capacity : {4UL, 2UL}) // 2: some choices overflow and are dropped
      e.push_back({"capacity " + std::to_string(capacity),
                   {{{5, 3}}, {{5, 4}, dtype::f64, true}},
                   attributes{0.0, {capacity}, false}});
    return e;
  }
};

/// expert outputs (E, C, H), gate probabilities (T, E) -> (T, H).
template <>
struct op_traits<op::moe_combine> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "expert outputs (E, C, H), gate probabilities (T, E) -> tokens (T, H)";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    const auto& e = v.in(0);
    const auto& p = v.in(1);
    if (e.rank() != 3 || p.rank() != 2 || p.dims[1] != e.dims[0])
      v.fail("expert outputs " + e.to_string() + " and gate probabilities " + p.to_string(),
             "expert outputs (E, C, H) and probabilities (T, E)");
    hspmd::shape out;
    out.dims = {p.dims[0], e.dims[2]};
    out.batch_dim = p.batch_dim;
    return out;
  }
  static node_cost cost(const node_view& v) {
    const double tokens = static_cast<double>(v.out().dims[0]);
    node_cost c = v.memory_cost();
    c.forward_flops = 4.0 * v.out_size();
    c.backward_flops = 4.0 * v.out_size() + 8.0 * tokens;
    return c;
  }
  static constexpr void signature(signature_builder& b) { b.sig().hand_written = true; }
  static constexpr void rules(rule_list& out) {
    rule r = replicated_rule(2);
    out.push(r);
    r.split_work = true;
    r.kind = rule::family::split;
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
  static std::vector<op_example> examples() {
    // Probabilities well away from ties and from a zero sum of the chosen two.
    return {{"", {{{4, 3, 2}}, {{5, 4}, dtype::f64, true}}}};
  }
};

} // namespace hspmd::graph
