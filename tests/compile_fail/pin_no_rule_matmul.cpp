// Manual SPMD: x split along its features (dimension 1) times a weight split along its output
// features (dimension 1): no rule multiplies these locally. The error names the op, the pinned
// placements and the redistribution to insert (replicate x: a column-parallel product).
// clang-format off
// hspmd-expect-error: no placement rule runs this op locally on its operands' pinned placements
// hspmd-expect-error: op_<hspmd::graph::op::matmul>
// hspmd-expect-error: operands_pinned_as<hspmd::split<1>, hspmd::split<1> >
// hspmd-expect-error: insert_redistribute_on_operand<0, hspmd::replicated>
// clang-format on
#include <hspmd/nn/ops.hpp>

int main() {
  using namespace hspmd;
  nn::tracer t(dtype::f32, 4);
  auto x = t.input<float, extents<batch, 64>, split<1>>("x");
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  auto w = t.parameter<float, extents<64, 32>, split<1>>("w", {}, {});
  auto y = nn::matmul(x, w);
#else
  auto w = t.parameter<float, extents<64, 32>, split<0>>("w", {}, {});
  auto y = nn::matmul(x, w); // row parallel: partial
  static_assert(std::is_same_v<decltype(y)::placement_type, partial>);
#endif
  return static_cast<int>(y.extent(1)) - 32;
}
