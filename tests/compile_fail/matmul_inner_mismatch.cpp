// matmul of (2, 3) by (4, 5): the inner extents 3 and 4 differ, and both are static.
// hspmd-expect-error: hspmd::matmul: inner extents differ
// hspmd-expect-error: matmul_inner_extents_differ<hspmd::detail::a_columns<3>,
// hspmd::detail::b_rows<4> >
#include <hspmd/core/tensor_ops.hpp>

int main() {
  hspmd::tensor<float, hspmd::extents<2, 3>> a;
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  hspmd::tensor<float, hspmd::extents<4, 5>> b;
#else
  hspmd::tensor<float, hspmd::extents<3, 5>> b;
#endif
  auto c = hspmd::matmul(a, b);
  return static_cast<int>(c.size()) - 10;
}
