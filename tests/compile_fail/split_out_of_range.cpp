// split<2> of a rank-2 tensor: dimensions are 0 and 1.
// hspmd-expect-error: split<D> names a dimension the tensor does not have
// hspmd-expect-error: split_dimension_out_of_range<hspmd::split<2>, hspmd::detail::tensor_rank<2> >
#include <hspmd/core/sharded.hpp>

#include <vector>

int main() {
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  using S = hspmd::sharded<float, hspmd::extents<8, 6>, hspmd::split<2>>;
#else
  using S = hspmd::sharded<float, hspmd::extents<8, 6>, hspmd::split<1>>;
#endif
  const std::vector<double> ratios{1.0, 1.0};
  auto s = S::zeros(hspmd::extents<8, 6>{}, ratios, 0);
  return static_cast<int>(s.local().size()) - 24;
}
