#pragma once
// A small, stable, platform-independent hash (64-bit FNV-1a) for fingerprints that ranks
// compare: the parsed cluster, the ratios, the plan. Not cryptographic; it only has to make
// accidental disagreement between ranks visible.

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace hspmd {

/// 64-bit FNV-1a of `bytes`, continuing from `h` (pass a previous result to chain).
[[nodiscard]] constexpr std::uint64_t fnv1a64(std::string_view bytes,
                                              std::uint64_t h = 0xcbf29ce484222325ULL) noexcept {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// A hash as 16 hex digits, as plans and agreement errors print it.
[[nodiscard]] inline std::string to_hex(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

} // namespace hspmd
