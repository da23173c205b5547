#pragma once
// Sufficient-factor broadcasting (SFB) for the weight gradient of a data-parallel linear layer.
//
// With the batch split unevenly, rank r holds x_r (b_r x m) and dy_r (b_r x n), and the weight
// gradient every rank needs is  dW = sum_r x_r^T dy_r  (m x n). Two ways to get it:
//   all-reduce : each rank computes its partial x_r^T dy_r and all-reduces m*n values;
//   SFB        : all-gather the factors x (B x m) and dy (B x n), then one local GEMM X^T DY.
// SFB moves B*(m + n) values instead of ~2*m*n, so it wins when the batch is small next to the
// layer (B*(m + n) < 2*m*n, roughly), at the price of B*m*n more multiply-adds on every rank.
// `weight_gradient_costs` gives both sides in bytes, flops and seconds for the synthesizer.
//
// Worked example: m = n = 4096, B = 64, f32: all-reduce moves 2*(n-1)/n * 64 MiB per rank,
// SFB gathers 64 * 8192 * 4 B = 2 MiB. With B = 8192, SFB would gather 256 MiB: all-reduce wins.

#include <hspmd/comm/communicator.hpp>
#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hd.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace hspmd {

/// What SFB gathers for per-rank row counts `batch_counts`, an m x n weight: all rows, and the
/// element counts per rank of x (rows of m) and dy (rows of n).
struct sfb_layout {
  std::size_t rows = 0;
  std::vector<std::size_t> x_counts;
  std::vector<std::size_t> dy_counts;
};
[[nodiscard]] inline sfb_layout sfb_layout_of(std::span<const std::size_t> batch_counts,
                                              std::size_t m, std::size_t n) {
  sfb_layout l;
  for (std::size_t b : batch_counts) {
    l.rows += b;
    l.x_counts.push_back(b * m);
    l.dy_counts.push_back(b * n);
  }
  return l;
}

/// Collective: dW = sum over ranks of x_r^T dy_r (m x n, row-major) on every rank, by
/// all-gathering x (rank r: batch_counts[r] rows of m) and dy (rows of n) and one local GEMM.
/// The rows are summed in global batch order, so every rank gets bit-identical results.
template <class Comm, class T>
requires communicator<Comm, T>
void sfb_weight_gradient(Comm& comm, std::span<const T> x, std::span<const T> dy,
                         std::span<const std::size_t> batch_counts, std::size_t m, std::size_t n,
                         std::span<T> dw, uneven_algorithm alg = uneven_algorithm::automatic) {
  const auto me = static_cast<std::size_t>(comm.rank());
  if (batch_counts.size() != static_cast<std::size_t>(comm.size()) || me >= batch_counts.size() ||
      x.size() != batch_counts[me] * m || dy.size() != batch_counts[me] * n || dw.size() != m * n)
    throw comm_error(comm.rank(), "sfb_weight_gradient",
                     "sizes do not fit: x " + std::to_string(x.size()) + ", dy " +
                         std::to_string(dy.size()) + ", dW " + std::to_string(dw.size()) +
                         " elements for m " + std::to_string(m) + ", n " + std::to_string(n),
                     "x is b_r x m, dy is b_r x n, dW is m x n, one batch count per rank");
  const auto [rows, x_counts, dy_counts] = sfb_layout_of(batch_counts, m, n);
  std::vector<T> xs(rows * m);
  std::vector<T> dys(rows * n);
  comm.all_gather_v(x, std::span<T>(xs), std::span<const std::size_t>(x_counts), alg);
  comm.all_gather_v(dy, std::span<T>(dys), std::span<const std::size_t>(dy_counts), alg);
  std::fill(dw.begin(), dw.end(), T{});
  for (std::size_t k = 0; k < rows; ++k)
    for (std::size_t i = 0; i < m; ++i) {
      const T xi = xs[k * m + i];
      for (std::size_t j = 0; j < n; ++j)
        dw[i * n + j] += xi * dys[k * n + j];
    }
}

/// The SFB product of gathered factors as a functor, for any backend (kernels/backend.hpp's
/// `for_each_index` over m * n): dw[i, j] = sum over rows r, in order, of xs[r, i] * dys[r, j]
/// -- the order of `sfb_weight_gradient`'s loop, so a device and the host sum alike (up to a
/// device's fused multiply-adds) and every rank of one kind gets the same bits.
template <class T>
struct sfb_outer_product {
  const T* xs;  ///< rows x m, the gathered inputs
  const T* dys; ///< rows x n, the gathered output gradients
  T* dw;        ///< m x n
  std::size_t rows, m, n;
  HSPMD_HD void operator()(std::size_t idx) const {
    const std::size_t i = idx / n;
    const std::size_t j = idx % n;
    T s{};
    for (std::size_t r = 0; r < rows; ++r)
      s += xs[r * m + i] * dys[r * n + j];
    dw[idx] = s;
  }
};

/// One way of producing a replicated weight gradient: bytes it moves per rank, local flops,
/// and predicted seconds.
struct gradient_path_cost {
  double bytes = 0.0;
  double flops = 0.0;
  double seconds = 0.0;
};

/// SFB next to all-reduce for a linear layer's weight gradient (see the file comment).
struct weight_gradient_costs {
  gradient_path_cost sfb;
  gradient_path_cost all_reduce;
  /// True when SFB is predicted faster.
  [[nodiscard]] bool sfb_wins() const noexcept { return sfb.seconds < all_reduce.seconds; }
};

/// Costs of both ways for batch_counts (rows per rank), an m x n weight, `elem_bytes` per
/// element, the communicator's cost `model`, and the *slowest* rank's speed in flop/s (every
/// rank computes the full SFB GEMM; the all-reduce path computes partials of b_r rows).
[[nodiscard]] inline weight_gradient_costs
weight_gradient_cost(const collective_cost_model& model, std::span<const std::size_t> batch_counts,
                     std::size_t m, std::size_t n, std::size_t elem_bytes,
                     double flops_per_second) {
  if (!(flops_per_second > 0.0) || batch_counts.empty())
    throw plan_error("weight_gradient_cost",
                     "flops_per_second " + std::to_string(flops_per_second) + " with " +
                         std::to_string(batch_counts.size()) + " ranks",
                     "a positive device speed and one batch count per rank");
  std::size_t rows = 0;
  std::size_t largest = 0;
  std::vector<std::size_t> x_counts;
  std::vector<std::size_t> dy_counts;
  for (std::size_t b : batch_counts) {
    rows += b;
    largest = std::max(largest, b);
    x_counts.push_back(b * m);
    dy_counts.push_back(b * n);
  }
  const auto md = static_cast<double>(m);
  const auto nd = static_cast<double>(n);
  const auto ranks = static_cast<double>(batch_counts.size());
  weight_gradient_costs c;
  c.sfb.bytes = static_cast<double>(rows) * (md + nd) * static_cast<double>(elem_bytes);
  c.sfb.flops = 2.0 * static_cast<double>(rows) * md * nd;
  c.sfb.seconds =
      model.estimate(collective::all_gather_v, uneven_algorithm::automatic, x_counts, elem_bytes) +
      model.estimate(collective::all_gather_v, uneven_algorithm::automatic, dy_counts, elem_bytes) +
      c.sfb.flops / flops_per_second;
  const std::size_t weight = m * n;
  c.all_reduce.bytes = 2.0 * (ranks - 1.0) / ranks * md * nd * static_cast<double>(elem_bytes);
  c.all_reduce.flops = 2.0 * static_cast<double>(largest) * md * nd;
  c.all_reduce.seconds = model.estimate(collective::all_reduce, uneven_algorithm::native,
                                        std::span<const std::size_t>(&weight, 1), elem_bytes) +
                         c.all_reduce.flops / flops_per_second;
  return c;
}

} // namespace hspmd
