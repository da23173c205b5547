#pragma once
// Element types. `dtype` is the runtime descriptor the synthesizer and the communication layer
// use (bytes per element drive every communication cost); `element_type` is the set of C++
// types a host tensor can hold.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace hspmd {

/// Runtime element type. bf16 and f16 are descriptors only for now (for byte counts in plans);
/// host tensors hold the four types of `element_type`.
enum class dtype : std::uint8_t { f32, f64, i32, i64, bf16, f16 };

/// Bytes per element.
[[nodiscard]] constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
  case dtype::i32:
    return 4;
  case dtype::f64:
  case dtype::i64:
    return 8;
  case dtype::bf16:
  case dtype::f16:
    return 2;
  }
  return 0; // unreachable for valid enumerators
}

/// Lower-case name as used in JSON and messages: "f32", "bf16", ...
[[nodiscard]] constexpr std::string_view name(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
    return "f32";
  case dtype::f64:
    return "f64";
  case dtype::i32:
    return "i32";
  case dtype::i64:
    return "i64";
  case dtype::bf16:
    return "bf16";
  case dtype::f16:
    return "f16";
  }
  return "?";
}

/// Inverse of `name`; empty for an unknown name.
[[nodiscard]] constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (dtype t : {dtype::f32, dtype::f64, dtype::i32, dtype::i64, dtype::bf16, dtype::f16})
    if (name(t) == s)
      return t;
  return std::nullopt;
}

/// True for the floating-point types.
[[nodiscard]] constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::bf16 || t == dtype::f16;
}

/// C++ types a host tensor can hold.
template <class T>
concept element_type = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t>;

/// The runtime descriptor of an element type: `dtype_of<float> == dtype::f32`.
template <element_type T>
inline constexpr dtype dtype_of = std::same_as<T, float>          ? dtype::f32
                                  : std::same_as<T, double>       ? dtype::f64
                                  : std::same_as<T, std::int32_t> ? dtype::i32
                                                                  : dtype::i64;

} // namespace hspmd
