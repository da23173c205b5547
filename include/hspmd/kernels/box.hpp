#pragma once
// Box copies between row-major tensors: the distributed executor's reblocking (a rank's piece
// of a whole tensor, rank-major blocks of a split version, all-to-all pieces) on the backend.

#include <hspmd/core/hd.hpp>
#include <hspmd/graph/signature.hpp>
#include <hspmd/kernels/backend.hpp>

#include <cstddef>
#include <vector>

namespace hspmd::exec {

namespace detail {
// Row-major strides of dims.
[[nodiscard]] inline std::vector<std::size_t> strides_of(const std::vector<std::size_t>& dims) {
  std::vector<std::size_t> s(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;)
    s[i - 1] = s[i] * dims[i];
  return s;
}
} // namespace detail

/// One index per contiguous run (the box's last dimension) of a box copy.
template <class E>
struct box_runs {
  const E* src;
  E* dst;
  std::size_t rank;
  std::size_t extent[graph::max_rank];
  std::size_t src_stride[graph::max_rank];
  std::size_t dst_stride[graph::max_rank];
  std::size_t src_base;
  std::size_t dst_base;
  bool add;
  HSPMD_HD void operator()(std::size_t i) const {
    std::size_t so = src_base;
    std::size_t d = dst_base;
    for (std::size_t k = rank - 1; k-- > 0;) {
      const std::size_t at = i % extent[k];
      i /= extent[k];
      so += at * src_stride[k];
      d += at * dst_stride[k];
    }
    const std::size_t run = extent[rank - 1];
    for (std::size_t j = 0; j < run; ++j) {
      if (add)
        dst[d + j] += src[so + j];
      else
        dst[d + j] = src[so + j];
    }
  }
};

/// Copies (or adds) the box `extent` at `src_start` of a row-major tensor of dims `src_dims` to
/// `dst_start` of one of dims `dst_dims`, on backend `b`.
template <backend B, class E>
void copy_box(B& b, const E* src, const std::vector<std::size_t>& src_dims,
              const std::vector<std::size_t>& src_start, E* dst,
              const std::vector<std::size_t>& dst_dims, const std::vector<std::size_t>& dst_start,
              const std::vector<std::size_t>& extent, bool add) {
  const std::size_t r = extent.size();
  std::size_t runs = 1;
  for (std::size_t e : extent)
    runs *= e;
  if (runs == 0)
    return;
  if (r == 0) {
    b.for_each_index(1, box_runs<E>{src, dst, 1, {1}, {1}, {1}, 0, 0, add});
    return;
  }
  box_runs<E> f{src, dst, r, {}, {}, {}, 0, 0, add};
  const auto ss = detail::strides_of(src_dims);
  const auto ds = detail::strides_of(dst_dims);
  for (std::size_t k = 0; k < r; ++k) {
    f.extent[k] = extent[k];
    f.src_stride[k] = ss[k];
    f.dst_stride[k] = ds[k];
    f.src_base += src_start[k] * ss[k];
    f.dst_base += dst_start[k] * ds[k];
  }
  b.for_each_index(runs / extent[r - 1], f);
}

} // namespace hspmd::exec
