#pragma once
// Reduction operators of the collectives, shared by every backend.

#include <string_view>

namespace hspmd {

/// Elementwise reduction of `all_reduce` and `reduce_scatter_v`.
enum class reduce_op : unsigned char { sum, max, min };

/// "sum", "max" or "min".
[[nodiscard]] constexpr std::string_view name(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::sum:
    return "sum";
  case reduce_op::max:
    return "max";
  case reduce_op::min:
    return "min";
  }
  return "?";
}

} // namespace hspmd
