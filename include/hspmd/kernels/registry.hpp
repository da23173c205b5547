#pragma once
// The kernel registry: every op's kernel pair (`kernel<O>` in kernels/<family>.hpp, see
// kernels/common.hpp for what a pair is), checked for completeness at compile time and
// dispatched by op at run time.
//
//     exec::run_kernel(context, /*backward=*/false);   // the node's forward on its backend
//
// A missing pair stops the build with `missing_kernel<op_named<"the op">, ...>` in the error.

#include <hspmd/graph/ops.hpp>
#include <hspmd/kernels/activation.hpp>
#include <hspmd/kernels/attention.hpp>
#include <hspmd/kernels/common.hpp>
#include <hspmd/kernels/elementwise.hpp>
#include <hspmd/kernels/io.hpp>
#include <hspmd/kernels/linalg.hpp>
#include <hspmd/kernels/moe.hpp>
#include <hspmd/kernels/normalization.hpp>
#include <hspmd/kernels/positional.hpp>
#include <hspmd/kernels/reduction.hpp>
#include <hspmd/kernels/shape.hpp>
#include <hspmd/kernels/vision.hpp>
#include <hspmd/kernels/vocabulary.hpp>

#include <cstdint>

namespace hspmd::exec {

/// The two halves of a kernel pair, as types for diagnostics.
namespace kernel_part {
struct pair {};     ///< no kernel<op::...> specialization at all
struct forward {};  ///< template <class T, class B> static void forward(kernel_context<T, B>&)
struct backward {}; ///< template <class T, class B> static void backward(kernel_context<T, B>&)
} // namespace kernel_part

template <class Op, class Part>
struct missing_kernel {
  static_assert(sizeof(Op) == 0,
                "hspmd: an op has no complete kernel pair: the instantiation names the op "
                "(op_named<...>) and the missing part (kernel_part::...); add it to "
                "kernel<graph::op::...> in kernels/<family>.hpp");
  static constexpr bool value = false;
};

namespace detail {
template <class Op, class Part, bool Present>
constexpr bool require_kernel_part() {
  if constexpr (Present)
    return true;
  else
    return missing_kernel<Op, Part>::value;
}
template <graph::op O, graph::fixed_string Name>
constexpr bool kernel_complete() {
  using name = graph::op_named<Name>;
  if constexpr (!requires { sizeof(kernel<O>); }) {
    return require_kernel_part<name, kernel_part::pair, false>();
  } else {
    kernel_context<float, detail::probe_backend>* c = nullptr;
    return require_kernel_part < name, kernel_part::forward, requires {
      kernel<O>::forward(*c);
    }
    > () && require_kernel_part < name, kernel_part::backward, requires {
      kernel<O>::backward(*c);
    }
    > ();
  }
}
} // namespace detail

#define HSPMD_EXEC_KERNEL_CHECK(o, form) &&detail::kernel_complete<graph::op::o, #o>()
static_assert(true HSPMD_GRAPH_OPS(HSPMD_EXEC_KERNEL_CHECK), "every op has a kernel pair");
#undef HSPMD_EXEC_KERNEL_CHECK

/// The inputs (a bit each) whose gradients op O's backward can store whole instead of adding
/// (`kernel<O>::assigns`, see kernels/common.hpp); 0 where the pair does not say.
template <graph::op O>
[[nodiscard]] constexpr std::uint32_t kernel_assigns() {
  if constexpr (requires { kernel<O>::assigns; })
    return kernel<O>::assigns;
  else
    return 0;
}
[[nodiscard]] inline std::uint32_t kernel_assigns(graph::op kind) {
  return graph::visit_op(kind, [](auto o) { return kernel_assigns<o.value>(); });
}

/// Runs the forward (or backward) kernel of the context's node.
template <class T, class B>
void run_kernel(kernel_context<T, B>& c, bool backward) {
  graph::visit_op(c.node().kind, [&](auto o) {
    if (backward)
      kernel<o.value>::backward(c);
    else
      kernel<o.value>::forward(c);
  });
}

} // namespace hspmd::exec
