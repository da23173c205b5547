// Two symbolic batch dimensions in one shape: only one size is bound at start-up.
// hspmd-expect-error: at most one dimension may be `batch`
#include <hspmd/core/extents.hpp>

int main() {
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  hspmd::extents<hspmd::batch, hspmd::batch> e(2, 3);
#else
  hspmd::extents<hspmd::batch, hspmd::dynamic_extent> e(2, 3);
#endif
  return static_cast<int>(e.size()) - 6;
}
