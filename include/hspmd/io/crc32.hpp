#pragma once
// CRC-32 as zlib, PNG and Python's zlib.crc32 compute it (polynomial 0xEDB88320, reflected,
// initial and final XOR 0xFFFFFFFF). Checkpoints checksum their pieces with it so that a reader
// without hspmd can verify them with the standard library.
//
// On x86-64 CPUs with carry-less multiplication (PCLMULQDQ, checked at run time) runs of 64 bytes
// and more are folded 64 bytes per step by carry-less products with x^k mod P constants, then
// reduced to 32 bits by Barrett reduction (Intel's "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ"); elsewhere, and for the tails, eight bytes per table step (slice-by-8).
// Measured on 1 GiB here: 0.55 s by tables, 0.30 s by zlib 1.2.13, 0.09 s folded.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define HSPMD_CRC32_FOLD 1
#include <immintrin.h>
#endif

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

namespace detail {

#if defined(HSPMD_CRC32_FOLD)
// x's two halves times k's (carry-less), plus next: 128 bits moved forward over the distance k
// stands for.
__attribute__((target("pclmul,sse4.1"))) inline __m128i crc32_fold_step(__m128i x, __m128i k,
                                                                        __m128i next) noexcept {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// The register `c` (not inverted) after the n bytes at p; n >= 64, a multiple of 16.
__attribute__((target("pclmul,sse4.1"))) inline std::uint32_t
crc32_fold(std::uint32_t c, const std::byte* p, std::size_t n) noexcept {
  const auto load = [](const std::byte* q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  };
  // Low and high 64 bits of each constant: x^(4*128+32) and x^(4*128-32) mod P (64 bytes a
  // step), x^(128+32) and x^(128-32) mod P (16 bytes), x^64 mod P, and Barrett's P' and mu.
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
  const __m128i poly = _mm_set_epi64x(0x1F7011641, 0x1DB710641);
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(c)));
  __m128i x1 = load(p + 16);
  __m128i x2 = load(p + 32);
  __m128i x3 = load(p + 48);
  p += 64;
  n -= 64;
  for (; n >= 64; n -= 64, p += 64) {
    x0 = crc32_fold_step(x0, k1k2, load(p));
    x1 = crc32_fold_step(x1, k1k2, load(p + 16));
    x2 = crc32_fold_step(x2, k1k2, load(p + 32));
    x3 = crc32_fold_step(x3, k1k2, load(p + 48));
  }
  x0 = crc32_fold_step(x0, k3k4, x1);
  x0 = crc32_fold_step(x0, k3k4, x2);
  x0 = crc32_fold_step(x0, k3k4, x3);
  for (; n >= 16; n -= 16, p += 16)
    x0 = crc32_fold_step(x0, k3k4, load(p));
  // 128 bits to 64 (with 32 zero bits appended), then to 32.
  x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), _mm_clmulepi64_si128(k3k4, x0, 0x01));
  x0 = _mm_xor_si128(_mm_srli_si128(x0, 4),
                     _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00));
  __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, mask32), poly, 0x10), mask32);
  t = _mm_clmulepi64_si128(t, poly, 0x00);
  return static_cast<std::uint32_t>(_mm_extract_epi32(_mm_xor_si128(x0, t), 1));
}

inline bool crc32_can_fold() noexcept {
  static const bool can = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return can;
}
#endif

/// The table path: CRC-32 of `bytes`, continuing from `crc`, eight bytes a step.
[[nodiscard]] inline std::uint32_t crc32_tables_only(std::span<const std::byte> bytes,
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

} // namespace detail

/// CRC-32 of `bytes`, continuing from `crc` (pass a previous result to chain; 0 to start).
[[nodiscard]] inline std::uint32_t crc32(std::span<const std::byte> bytes,
                                         std::uint32_t crc = 0) noexcept {
#if defined(HSPMD_CRC32_FOLD)
  if (bytes.size() >= 64 && detail::crc32_can_fold()) {
    const std::size_t folded = bytes.size() / 16 * 16;
    const std::uint32_t c = detail::crc32_fold(~crc, bytes.data(), folded);
    return detail::crc32_tables_only(bytes.subspan(folded), ~c);
  }
#endif
  return detail::crc32_tables_only(bytes, crc);
}

} // namespace hspmd::io
