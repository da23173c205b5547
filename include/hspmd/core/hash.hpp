#pragma once
// A small, stable, platform-independent hash (64-bit FNV-1a) for fingerprints that ranks
// compare: the parsed cluster, the ratios, the plan. Not cryptographic; it only has to make
// accidental disagreement between ranks visible.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
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

/// A fast 64-bit hash of bulk data (a batch every rank must feed alike, every step): four
/// independent lanes of 8-byte words, multiplied and rotated, so it runs at memory speed
/// rather than FNV's byte at a time. Stable across platforms of one byte order.
[[nodiscard]] inline std::uint64_t hash_bulk(std::span<const std::byte> bytes) noexcept {
  constexpr std::uint64_t k1 = 0x9e3779b97f4a7c15ULL;
  constexpr std::uint64_t k2 = 0xc2b2ae3d27d4eb4fULL;
  const auto mix = [](std::uint64_t h, std::uint64_t w) {
    h ^= w * k2;
    h = (h << 31U) | (h >> 33U);
    return h * k1;
  };
  std::uint64_t lane[4] = {k1, k2, k1 ^ k2, ~k1};
  const std::size_t words = bytes.size() / 8;
  std::size_t i = 0;
  for (; i + 4 <= words; i += 4)
    for (std::size_t l = 0; l < 4; ++l) {
      std::uint64_t w = 0;
      std::memcpy(&w, bytes.data() + 8 * (i + l), 8);
      lane[l] = mix(lane[l], w);
    }
  std::uint64_t h = static_cast<std::uint64_t>(bytes.size()) * k1;
  for (; i < words; ++i) {
    std::uint64_t w = 0;
    std::memcpy(&w, bytes.data() + 8 * i, 8);
    h = mix(h, w);
  }
  for (std::size_t b = 8 * words; b < bytes.size(); ++b)
    h = mix(h, static_cast<std::uint64_t>(bytes[b]));
  for (const std::uint64_t l : lane)
    h = mix(h, l);
  h ^= h >> 29U;
  h *= k2;
  return h ^ (h >> 32U);
}

/// A hash as 16 hex digits, as plans and agreement errors print it.
[[nodiscard]] inline std::string to_hex(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

} // namespace hspmd
