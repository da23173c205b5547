// Manual SPMD: ReLU is not linear, so it cannot run on a partial sum; the error says to
// all-reduce first (redistribute the operand to replicated).
// clang-format off
// hspmd-expect-error: no placement rule runs this op locally on its operands' pinned placements
// hspmd-expect-error: op_<hspmd::graph::op::relu>
// hspmd-expect-error: operands_pinned_as<hspmd::partial>
// hspmd-expect-error: insert_redistribute_on_operand<0, hspmd::replicated>
// clang-format on
#include <hspmd/nn/ops.hpp>

int main() {
  using namespace hspmd;
  nn::tracer t(dtype::f32, 4);
  auto x = t.input<float, extents<batch, 64>, split<1>>("x");
  auto w = t.parameter<float, extents<64, 32>, split<0>>("w", {}, {});
  auto partial_sum = nn::matmul(x, w);
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  auto y = nn::relu(partial_sum);
#else
  auto y = nn::relu(nn::redistribute<replicated>(partial_sum)); // all-reduce, then ReLU
  static_assert(std::is_same_v<decltype(y)::placement_type, replicated>);
  static_assert(nn::redistribution<partial, replicated>() == collective::all_reduce);
#endif
  return static_cast<int>(y.extent(1)) - 32;
}
