// mul of a (4, 4) matrix and a (4) vector: elementwise ops need equal ranks.
// hspmd-expect-error: elementwise op on tensors of different ranks
// hspmd-expect-error: elementwise_ranks_differ<hspmd::detail::left_rank<2>,
// hspmd::detail::right_rank<1> >
#include <hspmd/core/tensor_ops.hpp>

int main() {
  hspmd::tensor<double, hspmd::extents<4, 4>> a;
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  hspmd::tensor<double, hspmd::extents<4>> b;
#else
  hspmd::tensor<double, hspmd::extents<4, 4>> b;
#endif
  auto c = hspmd::mul(a, b);
  return static_cast<int>(c.size()) - 16;
}
