#pragma once
// The op registry: every op's facts, collected from its entry (`op_traits<O>` in
// graph/ops/<family>.hpp; what an entry states is listed in graph/ops/common.hpp), checked for
// completeness at compile time, and dispatched by op at run time.
//
//     graph::infer_shape(g, n);          // the output shape (throws shape_error naming the node)
//     graph::cost_of(g, id);             // forward and backward FLOPs and bytes
//     graph::signature_of(kind, ins, out, attr_dims, flag);   // constexpr: the placement rules
//     graph::visit_op(kind, [](auto o) { ... op_traits<o.value> ... });
//
// Adding an op: one line in graph/ops/list.hpp, its entry in a family header, its kernel pair
// in kernels/ (docs/developer.md has the checklist). A missing fact stops the build with
// `missing_registry_fact<op_named<"the op">, fact::...>` in the error.

#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops/activation.hpp>
#include <hspmd/graph/ops/attention.hpp>
#include <hspmd/graph/ops/common.hpp>
#include <hspmd/graph/ops/elementwise.hpp>
#include <hspmd/graph/ops/io.hpp>
#include <hspmd/graph/ops/linalg.hpp>
#include <hspmd/graph/ops/moe.hpp>
#include <hspmd/graph/ops/normalization.hpp>
#include <hspmd/graph/ops/positional.hpp>
#include <hspmd/graph/ops/reduction.hpp>
#include <hspmd/graph/ops/shape.hpp>
#include <hspmd/graph/ops/vision.hpp>
#include <hspmd/graph/ops/vocabulary.hpp>
#include <hspmd/graph/signature.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace hspmd::graph {

/// A compile-time string, so that diagnostics print an op's name.
template <std::size_t N>
struct fixed_string {
  char text[N]{};
  constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, text); } // NOLINT: implicit
};
/// Names an op in a compile error.
template <fixed_string Name>
struct op_named {};

/// The facts of a registry entry, as types for diagnostics.
namespace fact {
struct entry {};     ///< no op_traits specialization at all
struct summary {};   ///< static constexpr std::string_view summary
struct arity {};     ///< static constexpr std::size_t arity
struct shape {};     ///< static hspmd::shape shape(const node_view&)
struct cost {};      ///< static node_cost cost(const node_view&)
struct signature {}; ///< static constexpr void signature(signature_builder&)
struct examples {};  ///< static std::vector<op_example> examples()
struct rate {};      ///< static constexpr work rate
struct view {};      ///< static constexpr view_kind view
} // namespace fact

template <class Op, class Fact>
struct missing_registry_fact {
  static_assert(sizeof(Op) == 0,
                "hspmd: an op's registry entry lacks a fact: the instantiation names the op "
                "(op_named<...>) and the fact (fact::...); add it to op_traits<op::...> in "
                "graph/ops/<family>.hpp (graph/ops/common.hpp lists every fact)");
  static constexpr bool value = false;
};

namespace detail {
template <op O, class Fact, bool Present, fixed_string Name>
constexpr bool require_fact() {
  if constexpr (Present)
    return true;
  else
    return missing_registry_fact<op_named<Name>, Fact>::value;
}

template <op O, fixed_string Name>
constexpr bool entry_complete() {
  if constexpr (!requires { sizeof(op_traits<O>); }) {
    return require_fact<O, fact::entry, false, Name>();
  } else {
    using t = op_traits<O>;
    signature_builder* b = nullptr;
    const node_view* v = nullptr;
    return require_fact < O, fact::summary, requires {
      std::string_view{t::summary};
    }
    , Name > () && require_fact < O, fact::arity, requires {
      std::size_t{t::arity};
    }
    , Name > () && require_fact < O, fact::shape, requires {
      { t::shape(*v) } -> std::same_as<hspmd::shape>;
    }
    , Name > () && require_fact < O, fact::cost, requires {
      { t::cost(*v) } -> std::same_as<node_cost>;
    }
    , Name > () && require_fact < O, fact::signature, requires {
      t::signature(*b);
    }
    , Name > () && require_fact < O, fact::examples, requires {
      { t::examples() } -> std::same_as<std::vector<op_example>>;
    }
    , Name > () && require_fact < O, fact::rate, requires {
      { t::rate } -> std::convertible_to<work>;
    }
    , Name > () && require_fact < O, fact::view, requires {
      { t::view } -> std::convertible_to<view_kind>;
    }
    , Name > ();
  }
}
} // namespace detail

#define HSPMD_GRAPH_OP_CHECK(o, form) &&detail::entry_complete<op::o, #o>()
static_assert(true HSPMD_GRAPH_OPS(HSPMD_GRAPH_OP_CHECK), "every op has a complete registry entry");
#undef HSPMD_GRAPH_OP_CHECK

/// Calls `f(std::integral_constant<op, kind>{})`: the op as a constant, for `op_traits`.
template <class F>
constexpr decltype(auto) visit_op(op kind, F&& f) {
  switch (kind) {
#define HSPMD_GRAPH_OP_CASE(o, form)                                                               \
  case op::o:                                                                                      \
    return f(std::integral_constant<op, op::o>{});
    HSPMD_GRAPH_OPS(HSPMD_GRAPH_OP_CASE)
#undef HSPMD_GRAPH_OP_CASE
  }
  return f(std::integral_constant<op, op::input>{}); // not reached: every op has a case
}

/// What the op computes (its registry summary).
[[nodiscard]] constexpr std::string_view summary(op kind) {
  return visit_op(kind, [](auto o) { return std::string_view{op_traits<o.value>::summary}; });
}
/// How many inputs the op takes (`variadic`: one or more).
[[nodiscard]] constexpr std::size_t arity(op kind) {
  return visit_op(kind, [](auto o) { return std::size_t{op_traits<o.value>::arity}; });
}
/// The class of work that prices the op on a device.
[[nodiscard]] constexpr work rate(op kind) {
  return visit_op(kind, [](auto o) { return work{op_traits<o.value>::rate}; });
}
/// Whether the op's value can be a view of its input (see `view_kind`).
[[nodiscard]] constexpr view_kind view(op kind) {
  return visit_op(kind, [](auto o) { return view_kind{op_traits<o.value>::view}; });
}
/// Small valid calls of the op (gradient checks and kernel tests run every one).
[[nodiscard]] inline std::vector<op_example> examples(op kind) {
  return visit_op(kind, [](auto o) { return op_traits<o.value>::examples(); });
}

/// The output shape of node `n` given the graph's earlier nodes; throws `shape_error` naming the
/// node when the inputs do not fit the op.
[[nodiscard]] inline hspmd::shape infer_shape(const graph& g, const node& n) {
  const node_view v(g, n);
  const std::size_t want = arity(n.kind);
  if (want == variadic ? n.inputs.empty() : n.inputs.size() != want)
    v.fail(std::to_string(n.inputs.size()) + " inputs",
           (want == variadic ? std::string("at least 1") : std::to_string(want)) + " inputs for " +
               std::string(name(n.kind)));
  return visit_op(n.kind, [&](auto o) { return op_traits<o.value>::shape(v); });
}

/// Forward and backward cost of node `id` of `g` (see graph/ops/common.hpp).
[[nodiscard]] inline node_cost cost_of(const graph& g, node_id id) {
  const node_view v(g, g[id]);
  return visit_op(g[id].kind, [&](auto o) { return op_traits<o.value>::cost(v); });
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

/// The placement signature of an op with inputs `ins` and output `out`. `attr_dims` and `flag`
/// are the node's attributes (permutation, slice / concat axis, transposed second operand).
[[nodiscard]] constexpr signature signature_of(op kind, std::span<const dims_view> ins,
                                               const dims_view& out,
                                               std::span<const std::size_t> attr_dims = {},
                                               bool flag = false) {
  signature_builder b(ins, out, attr_dims, flag);
  visit_op(kind, [&](auto o) { op_traits<o.value>::signature(b); });
  return b.sig();
}

/// The rules an op with a hand-written signature lists itself (nothing for the others).
constexpr void hand_written_rules(op kind, rule_list& out) {
  visit_op(kind, [&](auto o) {
    if constexpr (requires { op_traits<o.value>::rules(out); })
      op_traits<o.value>::rules(out);
  });
}

} // namespace hspmd::graph
