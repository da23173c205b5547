#pragma once
// Materializing parameters: element i of parameter P is N(0, stddev^2) drawn at
// (seed, fnv1a64(P's name), global index of i), or a constant, so any rank can materialize any
// slice of any parameter and get what a single process holds there.

#include <hspmd/core/hash.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/program/layout.hpp>

#include <algorithm>
#include <cstdint>
#include <span>

namespace hspmd::exec {

/// Fills `out` with parameter `n`'s values (its piece `l` when given) for `seed`.
template <class T>
void initialize_parameter(const graph::node& n, const program::node_layout* l, std::uint64_t seed,
                          std::span<T> out) {
  if (n.init.how == graph::initializer::kind::constant) {
    std::fill(out.begin(), out.end(), static_cast<T>(n.init.value));
    return;
  }
  const rng_key key{seed, fnv1a64(n.name)};
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<T>(n.init.value * normal01(key, l != nullptr ? l->global_index(i) : i));
}

} // namespace hspmd::exec
