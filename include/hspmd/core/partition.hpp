#pragma once
// Turning sharding ratios into integer shard lengths.
//
// Ratios are real (e.g. 2/3 : 1/3 for a device twice as fast); shards are whole rows. We use
// largest-remainder rounding: every rank gets floor(total * r_i), and the leftover units go to
// the ranks with the largest fractional parts (ties to the lower rank). The result sums to
// `total` exactly, no length is off from total * r_i by a whole unit or more, a zero ratio gets
// a zero-length shard, and every rank computes the same answer from the same inputs.
//
// Worked example: total 10, ratios 5:3:1 -> exact 5.556, 3.333, 1.111 -> floors 5, 3, 1 (sum 9)
// -> the one leftover goes to rank 0 (fraction .556 is the largest) -> 6, 3, 1.

#include <hspmd/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace hspmd {

/// Splits `total` units into one integer length per ratio by largest-remainder rounding.
/// Ratios need not sum to 1 (they are normalized). Throws `plan_error` when a ratio is negative
/// or not finite, when they sum to zero, or when there are none.
[[nodiscard]] inline std::vector<std::size_t> shard_lengths(std::size_t total,
                                                            std::span<const double> ratios) {
  if (ratios.empty())
    throw plan_error("shard_lengths", "no ratios given", "pass one ratio per rank");
  double sum = 0.0;
  for (std::size_t i = 0; i < ratios.size(); ++i) {
    if (!std::isfinite(ratios[i]) || ratios[i] < 0.0)
      throw plan_error("shard_lengths",
                       "ratio " + std::to_string(i) + " is " + std::to_string(ratios[i]),
                       "ratios must be finite and >= 0");
    sum += ratios[i];
  }
  if (!(sum > 0.0))
    throw plan_error("shard_lengths", "all ratios are zero", "give at least one rank a share");

  std::vector<std::size_t> lengths(ratios.size());
  std::vector<double> remainder(ratios.size());
  std::size_t assigned = 0;
  for (std::size_t i = 0; i < ratios.size(); ++i) {
    const double exact = static_cast<double>(total) * (ratios[i] / sum);
    const double whole = std::floor(exact);
    lengths[i] = std::min(static_cast<std::size_t>(whole), total - assigned);
    remainder[i] = exact - whole;
    assigned += lengths[i];
  }
  // Hand out what rounding down left over, largest fraction first, lower rank on ties.
  std::vector<std::size_t> order(ratios.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  for (std::size_t k = 0; assigned < total; k = (k + 1) % order.size()) {
    if (ratios[order[k]] == 0.0)
      continue; // a zero ratio stays a zero-length shard
    ++lengths[order[k]];
    ++assigned;
  }
  return lengths;
}

/// Exclusive prefix sums of `lengths`: where each rank's shard starts.
[[nodiscard]] inline std::vector<std::size_t> shard_offsets(std::span<const std::size_t> lengths) {
  std::vector<std::size_t> offsets(lengths.size());
  std::exclusive_scan(lengths.begin(), lengths.end(), offsets.begin(), std::size_t{0});
  return offsets;
}

} // namespace hspmd
