// add of (batch, 768) and (batch, 512): dimension 1 is static in both and differs.
// hspmd-expect-error: elementwise op on tensors of different shapes
// hspmd-expect-error: elementwise_extents_differ<hspmd::detail::at_dimension<1>,
// hspmd::detail::left_extent<768>, hspmd::detail::right_extent<512> >
#include <hspmd/core/tensor_ops.hpp>

int main() {
  hspmd::tensor<float, hspmd::extents<hspmd::batch, 768>> a(4);
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  hspmd::tensor<float, hspmd::extents<hspmd::batch, 512>> b(4);
#else
  hspmd::tensor<float, hspmd::extents<hspmd::batch, 768>> b(4);
#endif
  auto c = hspmd::add(a, b);
  return static_cast<int>(c.size()) - 3072;
}
