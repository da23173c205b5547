#pragma once
// Kernels of the broadcasting binary ops (add, sub, mul), broadcast and dropout (registry:
// graph/ops/elementwise.hpp). A broadcast operand's gradient is reduced per operand element
// (each functor index owns one element of the gradient it adds to, so no two indices collide).

#include <hspmd/core/fastmath.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/kernels/common.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace hspmd::exec {

/// out[o] = a[ia(o)] (+ - *) b[ib(o)].
template <class T, graph::op O>
struct binary_forward {
  const T* a;
  const T* b;
  T* out;
  broadcast_index ia, ib;
  HSPMD_HD void operator()(std::size_t o) const {
    const T x = a[ia(o)];
    const T y = b[ib(o)];
    if constexpr (O == graph::op::add)
      out[o] = x + y;
    else if constexpr (O == graph::op::sub)
      out[o] = x - y;
    else
      out[o] = x * y;
  }
};

/// The same when one operand is a trailing block of the other (the bias of a layer, a position
/// table): result row r reads `full` row r and the whole of `block`; `block_first` says which
/// side of the operator the block is on. No index arithmetic per element, so the row vectorizes.
template <class T, graph::op O>
struct binary_rows_forward {
  const T* full;
  const T* block;
  T* out;
  std::size_t len;
  bool block_first;
  HSPMD_HD HSPMD_INLINE static T apply(T x, T y) {
    if constexpr (O == graph::op::add)
      return x + y;
    else if constexpr (O == graph::op::sub)
      return x - y;
    else
      return x * y;
  }
  HSPMD_HD void operator()(std::size_t r, std::size_t j0, std::size_t w) const {
    const T* f = full + r * len + j0;
    const T* b = block + j0;
    T* o = out + r * len + j0;
    if (block_first)
      for (std::size_t j = 0; j < w; ++j)
        o[j] = apply(b[j], f[j]);
    else
      for (std::size_t j = 0; j < w; ++j)
        o[j] = apply(f[j], b[j]);
  }
};

/// d(operand)[j] += sign * sum over the result elements o reading j of dy[o] (* other[io(o)]
/// for mul).
template <class T, bool Product>
struct binary_backward {
  const T* dy;
  const T* other; // mul: the other operand
  T* d;
  T sign;
  broadcast_fanout fan;
  broadcast_index other_at;
  bool assign = false;
  HSPMD_HD void operator()(std::size_t j) const {
    const std::size_t base = fan.first(j);
    T s{0};
    for (std::size_t r = 0; r < fan.count; ++r) {
      const std::size_t o = fan.nth(base, r);
      if constexpr (Product)
        s += dy[o] * other[other_at(o)];
      else
        s += dy[o];
    }
    contribute(d[j], sign * s, assign);
  }
};

/// The same for an operand of the result's shape: d[j] += sign * dy[j] (* other[io(j)]).
template <class T, bool Product>
struct binary_backward_same {
  const T* dy;
  const T* other;
  T* d;
  T sign;
  broadcast_index other_at;
  bool assign = false;
  HSPMD_HD void operator()(std::size_t j) const {
    if constexpr (Product)
      contribute(d[j], sign * (dy[j] * other[other_at(j)]), assign);
    else
      contribute(d[j], sign * dy[j], assign);
  }
};

template <graph::op O>
struct binary_kernel {
  static constexpr std::uint32_t assigns = 0b11;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto& out = c.out_shape();
    const broadcast_index ia(c.in_shape(0), out), ib(c.in_shape(1), out);
    if ((ia.identity && ib.modulo != 0) || (ib.identity && ia.modulo != 0)) {
      const bool block_first = ia.modulo != 0;
      const std::size_t len = block_first ? ia.modulo : ib.modulo;
      for_each_row_slice(c.backend(), c.out_size() / len, len,
                         binary_rows_forward<T, O>{block_first ? c.in(1) : c.in(0),
                                                   block_first ? c.in(0) : c.in(1), c.out(), len,
                                                   block_first});
      return;
    }
    for_each_index(c.backend(), c.out_size(),
                   binary_forward<T, O>{c.in(0), c.in(1), c.out(),
                                        broadcast_index(c.in_shape(0), out),
                                        broadcast_index(c.in_shape(1), out)});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const auto& out = c.out_shape();
    constexpr bool product = O == graph::op::mul;
    for (std::size_t k = 0; k < 2; ++k) {
      const T sign = O == graph::op::sub && k == 1 ? T{-1} : T{1};
      if (c.in_shape(k).dims == out.dims) {
        for_each_index(c.backend(), out.size(),
                       binary_backward_same<T, product>{c.dout(), c.in(1 - k), c.din(k), sign,
                                                        broadcast_index(c.in_shape(1 - k), out),
                                                        c.assign(k)});
        continue;
      }
      const broadcast_index own(c.in_shape(k), out);
      if (!product && own.modulo != 0) {
        // a trailing-block operand (a bias): d[j] += sign * the column sums of dy
        column_sums<T, 1>(c.backend(), out.size() / own.modulo, own.modulo,
                          matrix_column<T>{c.dout(), own.modulo},
                          contribute_column<T>{c.din(k), sign, c.assign(k)});
        continue;
      }
      for_each_index(c.backend(), c.in_shape(k).size(),
                     binary_backward<T, product>{c.dout(), c.in(1 - k), c.din(k), sign,
                                                 broadcast_fanout(c.in_shape(k), out),
                                                 broadcast_index(c.in_shape(1 - k), out),
                                                 c.assign(k)});
    }
  }
};

template <>
struct kernel<graph::op::add> : binary_kernel<graph::op::add> {};
template <>
struct kernel<graph::op::sub> : binary_kernel<graph::op::sub> {};
template <>
struct kernel<graph::op::mul> : binary_kernel<graph::op::mul> {};

/// out[o] = x[ix(o)].
template <class T>
struct broadcast_forward {
  const T* x;
  T* out;
  broadcast_index ix;
  HSPMD_HD void operator()(std::size_t o) const { out[o] = x[ix(o)]; }
};

template <>
struct kernel<graph::op::broadcast> {
  static constexpr std::uint32_t assigns = 0b1;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    for_each_index(
        c.backend(), c.out_size(),
        broadcast_forward<T>{c.in(0), c.out(), broadcast_index(c.in_shape(0), c.out_shape())});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.in_shape(0).size(),
                   binary_backward<T, false>{c.dout(),
                                             nullptr,
                                             c.din(0),
                                             T{1},
                                             broadcast_fanout(c.in_shape(0), c.out_shape()),
                                             {},
                                             c.assign(0)});
  }
};

/// Where a rank's piece of a tensor sits in the whole one, as plain numbers for functors: the
/// piece is `runs` runs of `run` consecutive global elements; run r starts at global element
/// (r * global_split + offset) * inner + base.
struct piece_runs {
  std::size_t runs = 1;
  std::size_t run = 0;
  std::size_t inner = 1;
  std::size_t global_split = 1;
  std::size_t offset = 0;
  std::size_t base = 0; // program::node_layout::base

  [[nodiscard]] static piece_runs of(const program::node_layout* l, std::size_t size) {
    piece_runs p;
    p.run = size;
    p.base = l == nullptr ? 0 : l->base;
    if (l == nullptr || !l->split || l->length == 0 || size == 0)
      return p;
    for (std::size_t d = *l->split + 1; d < l->global.size(); ++d)
      p.inner *= l->global[d];
    p.run = l->length * p.inner;
    p.runs = size / p.run;
    p.global_split = l->global[*l->split];
    p.offset = l->offset;
    return p;
  }
  [[nodiscard]] HSPMD_HD std::size_t first_global(std::size_t r) const {
    return (r * global_split + offset) * inner + base;
  }
};

/// Dropout masks: element with global index g keeps its value (scaled by 1 / (1 - p)) when word
/// g % 4 of Philox block g / 4 of stream (seed ^ step, node) is at least p * 2^32 -- the values
/// `fill_uniform01_u32` draws, so any piece draws what the whole tensor draws there. One functor
/// index per Philox block of a run, so each block is drawn once.
template <class T>
struct dropout_mask {
  rng_key key;
  double p;
  T keep;
  piece_runs piece;
  std::size_t blocks_per_run; // an upper bound: run / 4 + 2
  T* mask;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t r = piece.runs == 1 ? 0 : i / blocks_per_run; // one run: no division
    const std::size_t g0 = piece.first_global(r);
    const std::uint64_t block = g0 / 4 + (piece.runs == 1 ? i : i % blocks_per_run);
    const std::uint64_t lo = block * 4 > g0 ? block * 4 : g0;
    const std::uint64_t hi = block * 4 + 4 < g0 + piece.run ? block * 4 + 4 : g0 + piece.run;
    if (lo >= hi)
      return;
    const auto words = random_block(key, block);
    T* m = mask + r * piece.run + (lo - g0);
    if (hi - lo == 4) { // a whole block: the common case
      for (std::size_t w = 0; w < 4; ++w)
        m[w] = static_cast<double>(words[w]) * 0x1.0p-32 >= p ? keep : T{0};
      return;
    }
    for (std::uint64_t g = lo; g < hi; ++g) {
      const double u = static_cast<double>(words[g % 4]) * 0x1.0p-32;
      mask[r * piece.run + (g - g0)] = u >= p ? keep : T{0};
    }
  }
};

/// The common case of `dropout_mask` fused with its product: a piece that is one run starting
/// at a multiple of 4 (every whole tensor). Index i draws Philox block first_block + i and writes
/// its four mask elements and outputs, with no branch (the loop vectorizes); `threshold` =
/// ceil(p 2^32), so a word w keeps its element exactly when w 2^-32 >= p, as above. Indices
/// past `n` (the last block's tail) are skipped by the caller launching n / 4 of them and one
/// `dropout_mask` for the rest.
template <class T>
struct dropout_aligned {
  rng_key key;
  std::uint64_t first_block;
  std::uint64_t threshold;
  T keep;
  const T* x;
  T* mask;
  T* out;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const {
    const auto words = random_block(key, first_block + i);
    for (std::size_t w = 0; w < 4; ++w) {
      const T m = math::select(std::uint64_t{words[w]} >= threshold, keep, T{0});
      mask[4 * i + w] = m;
      out[4 * i + w] = x[4 * i + w] * m;
    }
  }
};

/// out[i] = x[i] * m[i] (forward); dx[i] += dy[i] * m[i] (backward).
template <class T, bool Add>
struct masked_copy {
  const T* x;
  const T* m;
  T* out;
  bool assign = false; ///< (Add: store instead)
  HSPMD_HD void operator()(std::size_t i) const {
    if constexpr (Add)
      contribute(out[i], x[i] * m[i], assign);
    else
      out[i] = x[i] * m[i];
  }
};

/// A mask value for every element, 1 when not training.
template <class T>
struct constant_fill {
  T* out;
  T v;
  HSPMD_HD void operator()(std::size_t i) const { out[i] = v; }
};

template <>
struct kernel<graph::op::dropout> {
  static constexpr std::uint32_t assigns = 0b1;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const std::size_t n = c.out_size();
    T* mask = c.saved(n);
    const double p = c.attrs().scalar;
    const auto& s = c.state();
    if (s.training && p > 0.0) {
      const rng_key key{s.seed ^ (s.step * 0x9E3779B97F4A7C15ULL), fnv1a64(c.node().name)};
      const piece_runs piece = piece_runs::of(c.layout(), n);
      const T keep = static_cast<T>(1.0 / (1.0 - p));
      // (a device takes a piece of several runs in one launch of the general form below)
      bool aligned = piece.runs == 1 || (host_memory_v<B> && piece.run % 4 == 0);
      for (std::size_t r = 0; aligned && r < piece.runs; ++r)
        aligned = piece.first_global(r) % 4 == 0;
      if (aligned) { // mask and product in one pass, run by run (a split of heads: one a sample)
        const auto threshold = static_cast<std::uint64_t>(std::ceil(p * 0x1.0p32));
        for (std::size_t r = 0; r < piece.runs; ++r) {
          const std::size_t at = r * piece.run;
          const std::size_t len = std::min(piece.run, n - at);
          const std::uint64_t first = piece.first_global(r) / 4;
          for_each_index(c.backend(), len / 4,
                         dropout_aligned<T>{key, first, threshold, keep, c.in(0) + at, mask + at,
                                            c.out() + at});
          const std::size_t done = len / 4 * 4;
          if (done < len) {  // (one run) the last block's first len % 4 elements
            piece_runs tail; // one run of len % 4 elements from global element first + done
            tail.run = len - done;
            tail.offset = piece.first_global(r) + done;
            for_each_index(c.backend(), 1,
                           dropout_mask<T>{key, p, keep, tail, 1, mask + at + done});
            for_each_index(
                c.backend(), len - done,
                masked_copy<T, false>{c.in(0) + at + done, mask + at + done, c.out() + at + done});
          }
        }
        return;
      }
      const std::size_t per_run = piece.run / 4 + 2;
      for_each_index(c.backend(), n == 0 ? 0 : piece.runs * per_run,
                     dropout_mask<T>{key, p, keep, piece, per_run, mask});
    } else {
      for_each_index(c.backend(), n, constant_fill<T>{mask, T{1}});
    }
    for_each_index(c.backend(), n, masked_copy<T, false>{c.in(0), mask, c.out()});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.out_size(),
                   masked_copy<T, true>{c.dout(), c.saved(), c.din(0), c.assign(0)});
  }
};

} // namespace hspmd::exec
