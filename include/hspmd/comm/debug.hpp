#pragma once
// Collective-mismatch detection (HSPMD_DEBUG=detail).
//
// In SPMD code a rank that calls a different collective, or the same one with other counts,
// usually hangs the job or silently corrupts data. In debug mode every collective is preceded by
// an exchange of fingerprints (sequence number, op, element type, counts, root, reduction,
// algorithm); on any difference every rank fails with both fingerprints in the message. With
// the variable unset the check is one branch on a bool per call.

#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace hspmd {

/// Debug level from the environment variable HSPMD_DEBUG: unset, "" or "off" -> false,
/// "detail" -> true. Throws `config_error` for other values.
[[nodiscard]] inline bool debug_collectives_from_env() {
  const char* v = std::getenv("HSPMD_DEBUG");
  const std::string_view s = v == nullptr ? std::string_view{} : std::string_view{v};
  if (s.empty() || s == "off")
    return false;
  if (s == "detail")
    return true;
  throw config_error("environment variable HSPMD_DEBUG", "unknown value \"" + std::string(s) + "\"",
                     "expected \"off\" or \"detail\"");
}

/// What one rank is about to do, in a fixed-size form that ranks can exchange.
struct call_fingerprint {
  std::uint64_t sequence = 0;    ///< how many collectives this communicator ran before
  std::uint64_t op = 0;          ///< `collective`
  std::uint64_t element = 0;     ///< element type code (see element_name)
  std::uint64_t count = 0;       ///< elements of the call (total over ranks for v-collectives)
  std::uint64_t counts_hash = 0; ///< FNV-1a of the per-rank counts (0 when there are none)
  std::uint64_t root = 0;        ///< root rank + 1, 0 when the call has no root
  std::uint64_t reduction = 0;   ///< `reduce_op` + 1, 0 when the call does not reduce
  std::uint64_t algorithm = 0;   ///< `uneven_algorithm` as resolved on this rank

  [[nodiscard]] std::array<std::uint64_t, 8> words() const noexcept {
    return {sequence, op, element, count, counts_hash, root, reduction, algorithm};
  }
  [[nodiscard]] static call_fingerprint from_words(std::span<const std::uint64_t, 8> w) noexcept {
    return {w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]};
  }
  friend bool operator==(const call_fingerprint&, const call_fingerprint&) = default;
};

/// Element type codes of fingerprints.
[[nodiscard]] constexpr std::string_view element_name(std::uint64_t code) noexcept {
  constexpr std::array<std::string_view, 7> names = {"f32", "f64",  "i32", "i64",
                                                     "u64", "byte", "char"};
  return code < names.size() ? names.at(code) : "?";
}

/// The fingerprint code of element type `T` (see element_name).
template <class T>
inline constexpr std::uint64_t element_code = std::is_same_v<T, float>           ? 0
                                              : std::is_same_v<T, double>        ? 1
                                              : std::is_same_v<T, std::int32_t>  ? 2
                                              : std::is_same_v<T, std::int64_t>  ? 3
                                              : std::is_same_v<T, std::uint64_t> ? 4
                                              : std::is_same_v<T, std::byte>     ? 5
                                                                                 : 6;

/// FNV-1a of a counts vector, for fingerprints.
[[nodiscard]] inline std::uint64_t hash_counts(std::span<const std::size_t> counts) noexcept {
  std::uint64_t h = fnv1a64({});
  for (std::size_t c : counts) {
    const auto v = static_cast<std::uint64_t>(c);
    std::array<char, 8> bytes{};
    for (std::size_t i = 0; i < 8; ++i)
      bytes.at(i) = static_cast<char>((v >> (8U * i)) & 0xffU);
    h = fnv1a64(std::string_view(bytes.data(), bytes.size()), h);
  }
  return h;
}

/// The fingerprint of a call of `sequence`-th collective `op` on elements of type `T`:
/// `root` and `reduction` are -1 when the call has none.
template <class T>
[[nodiscard]] call_fingerprint
fingerprint_of(std::uint64_t sequence, collective op, std::size_t count,
               std::span<const std::size_t> counts, int root, int reduction, uneven_algorithm alg) {
  call_fingerprint f;
  f.sequence = sequence;
  f.op = static_cast<std::uint64_t>(op);
  f.element = element_code<T>;
  f.count = count;
  f.counts_hash = counts.empty() ? 0 : hash_counts(counts);
  f.root = root < 0 ? 0 : static_cast<std::uint64_t>(root) + 1;
  f.reduction = reduction < 0 ? 0 : static_cast<std::uint64_t>(reduction) + 1;
  f.algorithm = static_cast<std::uint64_t>(alg);
  return f;
}

/// Every rank's fingerprint from the concatenated words of all ranks (8 per rank).
[[nodiscard]] inline std::vector<call_fingerprint>
unpack_fingerprints(std::span<const std::uint64_t> words) {
  std::vector<call_fingerprint> all;
  for (std::size_t at = 0; at + 8 <= words.size(); at += 8)
    all.push_back(call_fingerprint::from_words(words.subspan(at).first<8>()));
  return all;
}

/// "all_reduce #3 (f32, 10 elements, sum)" and the like.
[[nodiscard]] inline std::string describe(const call_fingerprint& f) {
  const auto op = static_cast<collective>(f.op);
  std::string s = std::string(f.op < collective_count ? name(op) : "unknown collective") + " #" +
                  std::to_string(f.sequence);
  if (op == collective::barrier)
    return s;
  s += " (" + std::string(element_name(f.element)) + ", " + std::to_string(f.count) +
       (f.count == 1 ? " element" : " elements");
  if (f.counts_hash != 0) {
    constexpr std::string_view hex = "0123456789abcdef";
    s += ", counts hash ";
    for (int shift = 60; shift >= 32; shift -= 4) // the top 32 bits tell hashes apart
      s += hex.at((f.counts_hash >> static_cast<unsigned>(shift)) & 0xfU);
  }
  if (f.root != 0)
    s += ", root " + std::to_string(f.root - 1);
  if (f.reduction != 0) {
    constexpr std::array<std::string_view, 3> ops = {"sum", "max", "min"};
    s += ", " + std::string(f.reduction <= ops.size() ? ops.at(f.reduction - 1) : "?");
  }
  if (has_algorithms(op) && f.algorithm < uneven_algorithm_count)
    s += ", " + std::string(name(static_cast<uneven_algorithm>(f.algorithm)));
  return s + ")";
}

/// Given every rank's fingerprint (index = rank), throws `comm_error` on `my_rank` naming the
/// first rank that differs from rank 0 and both fingerprints. Every rank sees the same list,
/// so every rank throws.
inline void check_fingerprints(std::span<const call_fingerprint> all, int my_rank) {
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0])
      continue;
    throw comm_error(my_rank, "collective mismatch (HSPMD_DEBUG=detail)",
                     "rank 0 called " + describe(all[0]) + " but rank " + std::to_string(r) +
                         " called " + describe(all[r]),
                     "every rank must call the same collectives in the same order with matching "
                     "counts, root and reduction");
  }
}

} // namespace hspmd
