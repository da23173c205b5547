#pragma once
// CRC-32 as zlib, PNG and Python's zlib.crc32 compute it (polynomial 0xEDB88320, reflected,
// initial and final XOR 0xFFFFFFFF), eight bytes per step (slice-by-8). Checkpoints checksum
// their pieces with it so that a reader without hspmd can verify them with the standard library.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace hspmd::io {

namespace detail {
[[nodiscard]] constexpr std::array<std::array<std::uint32_t, 256>, 8> crc32_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1U) != 0 ? 0xEDB88320U ^ (c >> 1U) : c >> 1U;
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s)
    for (std::size_t i = 0; i < 256; ++i)
      t[s][i] = (t[s - 1][i] >> 8U) ^ t[0][t[s - 1][i] & 0xFFU];
  return t;
}
inline constexpr auto crc32_table = crc32_tables();
} // namespace detail

/// CRC-32 of `bytes`, continuing from `crc` (pass a previous result to chain; 0 to start).
[[nodiscard]] inline std::uint32_t crc32(std::span<const std::byte> bytes,
                                         std::uint32_t crc = 0) noexcept {
  const auto& t = detail::crc32_table;
  std::uint32_t c = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint32_t lo = 0;
    std::uint32_t hi = 0;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    if constexpr (std::endian::native == std::endian::big) {
      lo = __builtin_bswap32(lo);
      hi = __builtin_bswap32(hi);
    }
    lo ^= c;
    c = t[7][lo & 0xFFU] ^ t[6][(lo >> 8U) & 0xFFU] ^ t[5][(lo >> 16U) & 0xFFU] ^ t[4][lo >> 24U] ^
        t[3][hi & 0xFFU] ^ t[2][(hi >> 8U) & 0xFFU] ^ t[1][(hi >> 16U) & 0xFFU] ^ t[0][hi >> 24U];
  }
  for (; n > 0; --n, ++p)
    c = t[0][(c ^ static_cast<std::uint32_t>(*p)) & 0xFFU] ^ (c >> 8U);
  return ~c;
}

} // namespace hspmd::io
