#pragma once
// Registry entries of the graph's leaves: data inputs and trained parameters. They are loaded,
// not computed: no cost, no signature (the synthesizer chooses their placements).

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// Data fed each step (features, token ids, labels); its shape is given by the tracer.
template <>
struct op_traits<op::input> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "data fed each step (features, token ids, labels)";
  static constexpr std::size_t arity = 0;
  static hspmd::shape shape(const node_view& v) { return v.out(); }
  static node_cost cost(const node_view& /*v*/) { return {}; }
  static constexpr void signature(signature_builder& b) { b.sig().known = false; }
  static std::vector<op_example> examples() { return {}; }
};

/// A trained weight, initialized by `node::init`.
template <>
struct op_traits<op::parameter> : op_traits<op::input> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "a trained weight";
};

} // namespace hspmd::graph
