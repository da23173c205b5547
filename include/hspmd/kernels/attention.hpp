#pragma once
// Kernels of fused attention (registry: graph/ops/attention.hpp). No (S, T) score tensor is
// stored: the forward runs an online softmax per query row (the running maximum rescales the
// partial sums when it grows) and keeps the row's log-sum-exp; the backward recomputes each
// score from q and k. The backward runs per query row for dq and per key row for dk and dv, so
// no two functor indices write one gradient row (no atomics, the same order on every backend).
// A query piece (queries split among ranks) masks by its global positions, as the causal
// softmax does. Grouped-query attention: with fewer key/value heads than query heads, query
// head h reads key/value head h / (query heads / key/value heads), and a key row's gradient sums
// over the query heads of its group.

#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <cmath>
#include <cstddef>

namespace hspmd::exec {

/// Sizes of one attention node's local tensors: `rows` (the product of the leading dimensions)
/// times `s` queries of width `d` over `t` keys; values of width `e`; `q0`: the global position
/// of the first query (causal: query i sees keys j <= q0 + i); `hq` query heads share the
/// `hk` key/value heads of one leading index (hk divides hq; both 1 without a head dimension).
struct attention_dims {
  std::size_t rows, s, t, d, e, q0, hq, hk;
  bool causal;
  /// The key/value row that query row `row` (of `rows`) reads.
  [[nodiscard]] HSPMD_HD std::size_t kv_row(std::size_t row) const {
    return row / hq * hk + row % hq / (hq / hk);
  }
  /// Keys query i of a row sees.
  [[nodiscard]] HSPMD_HD std::size_t seen(std::size_t i) const {
    const std::size_t n = q0 + i + 1;
    return causal && n < t ? n : t;
  }
  /// The first query (of a row) that sees key j.
  [[nodiscard]] HSPMD_HD std::size_t first_query(std::size_t j) const {
    return causal && j > q0 ? j - q0 : 0;
  }
};

/// scale * a . b over n elements, in lanes.
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T scaled_dot(const T* a, const T* b, std::size_t n, T scale) {
  return scale * lane_sum<T>(n, [=](std::size_t x) { return a[x] * b[x]; });
}

/// Query row `qr` (row qr / s, query qr % s): out = softmax(scores) v by an online softmax,
/// lse[qr] = the log of the softmax denominator (with the maximum added back).
template <class T>
struct attention_forward {
  const T* q;
  const T* k;
  const T* v;
  T* out;
  T* lse;
  attention_dims n;
  T scale;
  HSPMD_HD void operator()(std::size_t qr) const {
    const std::size_t e = n.e;
    const T* qi = q + qr * n.d;
    const std::size_t kv = n.kv_row(qr / n.s);
    const T* kb = k + kv * n.t * n.d;
    const T* vb = v + kv * n.t * e;
    T* o = out + qr * e;
    for (std::size_t x = 0; x < e; ++x)
      o[x] = T{0};
    const std::size_t keys = n.seen(qr % n.s);
    T m = T{0};
    T l = T{0};
    for (std::size_t j = 0; j < keys; ++j) {
      const T sc = scaled_dot(qi, kb + j * n.d, n.d, scale);
      if (j == 0 || sc > m) { // a new maximum: what was summed so far shrinks by e^(m - sc)
        const T f = j == 0 ? T{0} : math::exp(m - sc);
        l *= f;
        for (std::size_t x = 0; x < e; ++x)
          o[x] *= f;
        m = sc;
      }
      const T p = math::exp(sc - m);
      l += p;
      const T* vj = vb + j * e;
      for (std::size_t x = 0; x < e; ++x)
        o[x] += p * vj[x];
    }
    if (keys == 0) {
      lse[qr] = T{0};
      return;
    }
    const T inv = T{1} / l;
    for (std::size_t x = 0; x < e; ++x)
      o[x] *= inv;
    lse[qr] = m + std::log(l);
  }
};

/// delta[qr] = dout[qr] . out[qr] (the softmax backward's row sum).
template <class T>
struct attention_delta {
  const T* dout;
  const T* out;
  T* delta;
  std::size_t e;
  HSPMD_HD void operator()(std::size_t qr) const {
    delta[qr] = scaled_dot(dout + qr * e, out + qr * e, e, T{1});
  }
};

/// dq of query row qr: sum over its keys of scale * p (dout . v_j - delta) k_j.
template <class T>
struct attention_dq {
  const T* q;
  const T* k;
  const T* v;
  const T* dout;
  const T* lse;
  const T* delta;
  T* dq;
  attention_dims n;
  T scale;
  HSPMD_HD void operator()(std::size_t qr) const {
    const std::size_t d = n.d;
    const T* qi = q + qr * d;
    const T* gi = dout + qr * n.e;
    const std::size_t kv = n.kv_row(qr / n.s);
    const T* kb = k + kv * n.t * d;
    const T* vb = v + kv * n.t * n.e;
    T* dqi = dq + qr * d;
    const std::size_t keys = n.seen(qr % n.s);
    for (std::size_t j = 0; j < keys; ++j) {
      const T* kj = kb + j * d;
      const T p = math::exp(scaled_dot(qi, kj, d, scale) - lse[qr]);
      const T ds = scale * p * (scaled_dot(gi, vb + j * n.e, n.e, T{1}) - delta[qr]);
      for (std::size_t x = 0; x < d; ++x)
        dqi[x] += ds * kj[x];
    }
  }
};

/// dk and dv of key row kr (row kr / t, key kr % t): sums over the queries that see it, in
/// every query head of its group.
template <class T>
struct attention_dkv {
  const T* q;
  const T* k;
  const T* v;
  const T* dout;
  const T* lse;
  const T* delta;
  T* dk;
  T* dv;
  attention_dims n;
  T scale;
  HSPMD_HD void operator()(std::size_t kr) const {
    const std::size_t d = n.d;
    const std::size_t e = n.e;
    const std::size_t row = kr / n.t;
    const std::size_t group = n.hq / n.hk;
    const std::size_t first_row = row / n.hk * n.hq + row % n.hk * group;
    const T* kj = k + kr * d;
    const T* vj = v + kr * e;
    T* dkj = dk + kr * d;
    T* dvj = dv + kr * e;
    for (std::size_t h = 0; h < group; ++h)
      for (std::size_t i = n.first_query(kr % n.t); i < n.s; ++i) {
        const std::size_t qr = (first_row + h) * n.s + i;
        const T* qi = q + qr * d;
        const T* gi = dout + qr * e;
        const T p = math::exp(scaled_dot(qi, kj, d, scale) - lse[qr]);
        for (std::size_t x = 0; x < e; ++x)
          dvj[x] += p * gi[x];
        const T ds = scale * p * (scaled_dot(gi, vj, e, T{1}) - delta[qr]);
        for (std::size_t x = 0; x < d; ++x)
          dkj[x] += ds * qi[x];
      }
  }
};

template <>
struct kernel<graph::op::attention> {
  template <class T, class B>
  static attention_dims dims_of(const kernel_context<T, B>& c) {
    const auto& q = c.in_shape(0);
    const std::size_t r = q.rank();
    attention_dims n{};
    n.s = q.dims[r - 2];
    n.d = q.dims[r - 1];
    n.t = c.in_shape(1).dims[r - 2];
    n.e = c.in_shape(2).dims[r - 1];
    n.rows = n.s * n.d == 0 ? 0 : q.size() / (n.s * n.d);
    n.hq = r > 3 ? q.dims[r - 3] : 1;
    n.hk = r > 3 ? c.in_shape(1).dims[r - 3] : 1;
    if (n.hq == 0 || n.hk == 0 || n.hq % n.hk != 0) // a piece without heads computes nothing
      n.hq = n.hk = 1;
    const program::node_layout* l = c.layout();
    n.q0 = l != nullptr ? l->offset_of(r - 2) : 0;
    n.causal = c.attrs().flag;
    return n;
  }
  // Saved: the log-sum-exp of every query row, then room for the backward's row sums.
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const attention_dims n = dims_of(c);
    const std::size_t queries = n.rows * n.s;
    T* state = c.saved(2 * queries);
    for_each_index(c.backend(), queries,
                   attention_forward<T>{c.in(0), c.in(1), c.in(2), c.out(), state, n,
                                        static_cast<T>(c.attrs().scalar)});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const attention_dims n = dims_of(c);
    const std::size_t queries = n.rows * n.s;
    T* lse = c.saved(2 * queries);
    T* delta = lse + queries;
    const auto scale = static_cast<T>(c.attrs().scalar);
    for_each_index(c.backend(), queries, attention_delta<T>{c.dout(), c.out(), delta, n.e});
    for_each_index(
        c.backend(), queries,
        attention_dq<T>{c.in(0), c.in(1), c.in(2), c.dout(), lse, delta, c.din(0), n, scale});
    const std::size_t kv_rows = n.rows / n.hq * n.hk;
    for_each_index(c.backend(), kv_rows * n.t,
                   attention_dkv<T>{c.in(0), c.in(1), c.in(2), c.dout(), lse, delta, c.din(1),
                                    c.din(2), n, scale});
  }
};

} // namespace hspmd::exec
