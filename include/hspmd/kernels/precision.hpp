#pragma once
// Mixed precision: what a run stores in 16 bits and what it keeps in float.
//
//     ex.set_precision(exec::precision::bf16);   // before the first forward
//
// Under bf16 (or f16) an executor of float keeps
//   - parameters, their gradients and the optimizer's state in float (master weights);
//   - every activation and every activation gradient rounded to the 16-bit type as it is
//     stored (each kernel's output, each gradient contribution), so what a kernel reads is what
//     16-bit storage would hold;
//   - GEMM operands in the 16-bit type (weights rounded at each use) with float accumulation:
//     products of 16-bit values are exact in float, so this is what a tensor-core GEMM computes
//     up to the order of the sum (on a device the backend may run it natively: `gemm_16`);
//   - reductions inside kernels (softmax, norms, cross-entropy, their statistics), the loss and
//     every other scalar in float; in a distributed run, a rank's copies of parameters (and
//     their gradients) in float too.
// f16 also needs loss scaling (train/loss_scale.hpp): gradients below 2^-24 would vanish.
//
// On the host the 16-bit values are held in float buffers (the numerics of 16-bit storage, not
// its memory); f32 leaves everything as it was.

#include <hspmd/core/half.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/backend.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace hspmd::exec {

/// What activations and GEMM operands are stored in (see the file comment).
enum class precision : std::uint8_t { f32, bf16, f16 };

[[nodiscard]] constexpr std::string_view name(precision p) noexcept {
  switch (p) {
  case precision::f32:
    return "f32";
  case precision::bf16:
    return "bf16";
  case precision::f16:
    return "f16";
  }
  return "?";
}

/// "f32" (or "fp32"), "bf16", "f16" (or "fp16"); nullopt for anything else.
[[nodiscard]] constexpr std::optional<precision> parse_precision(std::string_view s) noexcept {
  if (s == "f32" || s == "fp32")
    return precision::f32;
  if (s == "bf16")
    return precision::bf16;
  if (s == "f16" || s == "fp16")
    return precision::f16;
  return std::nullopt;
}

/// x rounded to the nearest value of the 16-bit type (ties to even; f16 overflows to infinity).
template <class T>
[[nodiscard]] HSPMD_HD inline T round_to(precision p, T x) noexcept {
  if (p == precision::bf16)
    return static_cast<T>(static_cast<float>(bfloat16(static_cast<float>(x))));
  if (p == precision::f16)
    return static_cast<T>(static_cast<float>(float16(static_cast<float>(x))));
  return x;
}

/// to[i] = round_to(p, from[i]) (from == to rounds in place).
template <class T>
struct round_elements {
  const T* from;
  T* to;
  precision p;
  HSPMD_HD void operator()(std::size_t i) const { to[i] = round_to(p, from[i]); }
};

/// to[i] = the 16-bit encoding (bfloat16 or binary16 bits, by p) of from[i]: the operands of a
/// device's native 16-bit GEMM (cuda_backend::gemm_16). Decoded, it is round_to(p, from[i]).
template <class T>
struct encode_16 {
  const T* from;
  std::uint16_t* to;
  precision p;
  HSPMD_HD void operator()(std::size_t i) const {
    const auto x = static_cast<float>(from[i]);
    to[i] = p == precision::f16 ? float16(x).bits : bfloat16(x).bits;
  }
};

/// Rounds n elements at `data` (backend memory) to precision p; nothing for f32.
template <backend B, class T>
void round_in_place(B& b, precision p, T* data, std::size_t n) {
  if (p != precision::f32 && n != 0)
    b.for_each_index(n, round_elements<T>{data, data, p});
}

namespace detail {
// Elements a row-major operand spans: `rows` rows of `cols` elements, `ld` apart.
[[nodiscard]] HSPMD_HD constexpr std::size_t operand_extent(std::size_t rows, std::size_t cols,
                                                            std::size_t ld) noexcept {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}
// An operand's copy rounded to p, in backend memory.
template <class B, class T>
auto rounded_copy(B& b, precision p, const T* data, std::size_t n) {
  auto copy = b.template allocate<T>(n);
  if (n != 0)
    b.for_each_index(n, round_elements<T>{data, copy.data(), p});
  return copy;
}
} // namespace detail

/// C = alpha op(A) op(B) + beta C with A and B in precision p and float accumulation (see the
/// file comment): the backend's native 16-bit GEMM where it has one (`gemm_16`), else the
/// operands rounded into scratch buffers and the backend's float GEMM.
template <backend B, class T>
void gemm_in(B& b, precision p, transpose ta, transpose tb, std::size_t m, std::size_t n,
             std::size_t k, T alpha, const T* a, std::size_t lda, const T* bm, std::size_t ldb,
             T beta, T* c, std::size_t ldc) {
  if (p == precision::f32 || !std::is_same_v<T, float>) {
    b.gemm(ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc);
    return;
  }
  if constexpr (requires { b.gemm_16(p, ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc); }) {
    b.gemm_16(p, ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc);
  } else {
    const bool at = ta == transpose::yes;
    const bool bt = tb == transpose::yes;
    auto ra = detail::rounded_copy(b, p, a, detail::operand_extent(at ? k : m, at ? m : k, lda));
    auto rb = detail::rounded_copy(b, p, bm, detail::operand_extent(bt ? n : k, bt ? k : n, ldb));
    b.gemm(ta, tb, m, n, k, alpha, static_cast<const T*>(ra.data()), lda,
           static_cast<const T*>(rb.data()), ldb, beta, c, ldc);
  }
}

/// `batch` GEMMs in precision p (see `gemm_in`): operands `stride_*` elements apart.
template <backend B, class T>
void gemm_strided_batched_in(B& b, precision p, transpose ta, transpose tb, std::size_t m,
                             std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                             std::size_t stride_a, const T* bm, std::size_t ldb,
                             std::size_t stride_b, T beta, T* c, std::size_t ldc,
                             std::size_t stride_c, std::size_t batch) {
  if (p == precision::f32 || !std::is_same_v<T, float>) {
    b.gemm_strided_batched(ta, tb, m, n, k, alpha, a, lda, stride_a, bm, ldb, stride_b, beta, c,
                           ldc, stride_c, batch);
    return;
  }
  if constexpr (requires {
                  b.gemm_strided_batched_16(p, ta, tb, m, n, k, alpha, a, lda, stride_a, bm, ldb,
                                            stride_b, beta, c, ldc, stride_c, batch);
                }) {
    b.gemm_strided_batched_16(p, ta, tb, m, n, k, alpha, a, lda, stride_a, bm, ldb, stride_b, beta,
                              c, ldc, stride_c, batch);
  } else {
    const bool at = ta == transpose::yes;
    const bool bt = tb == transpose::yes;
    const auto span_of = [batch](std::size_t one, std::size_t stride) {
      return batch == 0 || one == 0 ? 0 : (batch - 1) * stride + one;
    };
    auto ra = detail::rounded_copy(
        b, p, a, span_of(detail::operand_extent(at ? k : m, at ? m : k, lda), stride_a));
    auto rb = detail::rounded_copy(
        b, p, bm, span_of(detail::operand_extent(bt ? n : k, bt ? k : n, ldb), stride_b));
    b.gemm_strided_batched(ta, tb, m, n, k, alpha, static_cast<const T*>(ra.data()), lda, stride_a,
                           static_cast<const T*>(rb.data()), ldb, stride_b, beta, c, ldc, stride_c,
                           batch);
  }
}

} // namespace hspmd::exec
