#pragma once
// Kernels of the vocabulary ops (registry: graph/ops/vocabulary.hpp): the embedding lookup and
// the cross-entropy loss, whole or vocabulary-parallel (a rank holds rows [v0, v0 + count) of
// the table, columns [v0, v0 + count) of the logits; ids outside its range contribute 0 here
// and their value on another rank).

#include <hspmd/core/fastmath.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace hspmd::exec {

/// The rows of an embedding table / columns of cross-entropy logits a node holds: first,
/// count, and the whole vocabulary.
struct vocab_span {
  std::size_t first = 0;
  std::size_t count = 0;
  std::size_t total = 0;
};
template <class T, class B>
[[nodiscard]] vocab_span vocab_range(const kernel_context<T, B>& c, std::size_t axis) {
  const std::size_t local = c.in_shape(0).dims[axis];
  const program::node_layout* l = c.in_layout(0);
  if (l == nullptr)
    return {0, local, local};
  return {l->offset_of(axis), local, l->global.at(axis)};
}

/// first[c] = the index of the first id outside [0, limit) among ids [c len, (c + 1) len), or
/// -1: the check where the ids are in device memory (one flag per chunk, read back).
struct first_bad_id {
  const std::int64_t* ids;
  std::size_t n;
  std::size_t len;
  std::size_t limit;
  std::int64_t* first;
  HSPMD_HD void operator()(std::size_t c) const {
    const std::size_t end = (c + 1) * len < n ? (c + 1) * len : n;
    std::int64_t found = -1;
    for (std::size_t i = c * len; i < end; ++i)
      if (ids[i] < 0 || static_cast<std::size_t>(ids[i]) >= limit) {
        found = static_cast<std::int64_t>(i);
        break;
      }
    first[c] = found;
  }
};

/// Refuses ids outside [0, limit) with the node and the range (before any kernel reads them).
template <class T, class B>
void check_ids(const kernel_context<T, B>& c, std::span<const std::int64_t> ids, std::size_t limit,
               const char* what) {
  auto refuse = [&](std::int64_t id) {
    c.fail(std::string(what) + " " + std::to_string(id) + " is out of range [0, " +
               std::to_string(limit) + ")",
           "check the data against the model's vocabulary or class count");
  };
  if constexpr (host_memory_v<B>) {
    for (const std::int64_t id : ids)
      if (id < 0 || static_cast<std::size_t>(id) >= limit)
        refuse(id);
  } else {
    constexpr std::size_t len = 1024;
    const std::size_t chunks = (ids.size() + len - 1) / len;
    B& be = c.backend();
    auto flags = be.template allocate<std::int64_t>(chunks);
    for_each_index(be, chunks, first_bad_id{ids.data(), ids.size(), len, limit, flags.data()});
    std::vector<std::int64_t> first(chunks);
    be.copy_to_host(first.data(), flags.data(), chunks);
    for (const std::int64_t i : first)
      if (i >= 0) {
        std::int64_t id = 0;
        be.copy_to_host(&id, ids.data() + i, 1);
        refuse(id);
      }
  }
}

/// out[t, j] = table[ids[t] - v0, j] for the rank's rows, else 0.
template <class T>
struct embedding_lookup {
  const T* table;
  const std::int64_t* ids;
  T* out;
  std::size_t h;
  vocab_span v;
  // columns [j0, j0 + w) of token t's row
  HSPMD_HD void operator()(std::size_t t, std::size_t j0, std::size_t w) const {
    const auto row = static_cast<std::size_t>(ids[t]);
    T* o = out + t * h + j0;
    if (row >= v.first && row < v.first + v.count) {
      const T* src = table + (row - v.first) * h + j0;
      for (std::size_t j = 0; j < w; ++j)
        o[j] = src[j];
    } else {
      for (std::size_t j = 0; j < w; ++j)
        o[j] = T{0};
    }
  }
};
/// The table's gradient rows for the W columns of block k, the tokens in order (a row two
/// tokens share is added to in token order on every backend).
template <class T, std::size_t W>
struct embedding_scatter {
  const std::int64_t* ids;
  const T* dy;
  T* dtable;
  std::size_t tokens;
  std::size_t h;
  vocab_span v;
  HSPMD_HD void operator()(std::size_t k) const {
    const std::size_t j0 = k * W;
    const std::size_t w = h - j0 < W ? h - j0 : W;
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto row = static_cast<std::size_t>(ids[t]);
      if (row < v.first || row >= v.first + v.count)
        continue;
      T* d = dtable + (row - v.first) * h + j0;
      const T* g = dy + t * h + j0;
      for (std::size_t j = 0; j < w; ++j)
        d[j] += g[j];
    }
  }
};

template <>
struct kernel<graph::op::embedding> {
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto v = vocab_range(c, 0);
    const auto ids = c.ids(1);
    check_ids(c, ids, v.total, "token id");
    const std::size_t h = c.in_shape(0).dims[1];
    for_each_row_slice(c.backend(), h == 0 ? 0 : c.out_size() / h, h,
                       embedding_lookup<T>{c.in(0), ids.data(), c.out(), h, v});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const auto ids = c.ids(1);
    constexpr std::size_t width = column_width_v<B>;
    for_each_index(c.backend(), column_blocks(c.in_shape(0).dims[1], width),
                   embedding_scatter<T, width>{ids.data(), c.dout(), c.din(0), ids.size(),
                                               c.in_shape(0).dims[1], vocab_range(c, 0)});
  }
};

/// lse[r] = the maximum of row r of the logits (-inf for an empty piece).
template <class T>
struct row_max {
  const T* logits;
  T* lse;
  std::size_t v;
  template <class Team>
  [[nodiscard]] HSPMD_HD static T of(const T* row, std::size_t n, const Team& t) {
    return n == 0 ? -std::numeric_limits<T>::infinity() : t.max(row, n);
  }
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T m = of(logits + r * v, v, t);
    if (t.leader())
      lse[r] = m;
  }
};
/// sums[r] = sum_j exp(logits[r, j] - lse[r]).
template <class T>
struct row_exp_sum {
  const T* logits;
  const T* lse;
  T* sums;
  std::size_t v;
  template <class Team>
  [[nodiscard]] HSPMD_HD static T of(const T* row, T m, std::size_t n, const Team& t) {
    return t.template sum<T>(n, [&](std::size_t j) { return math::exp(row[j] - m); });
  }
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T s = of(logits + r * v, lse[r], v, t);
    if (t.leader())
      sums[r] = s;
  }
};
/// Both of the above for row r while it is in cache (a whole vocabulary: nothing to combine
/// between the passes).
template <class T>
struct row_max_exp_sum {
  const T* logits;
  T* lse;
  T* sums;
  std::size_t v;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T* row = logits + r * v;
    const T m = row_max<T>::of(row, v, t);
    const T s = row_exp_sum<T>::of(row, m, v, t);
    if (t.leader()) {
      lse[r] = m;
      sums[r] = s;
    }
  }
};
/// lse[r] += log sums[r]; out[0] = scale * the sum over rows of (owner ? lse : 0) - the target's
/// logit where the rank holds it (one index: the sum runs in order).
template <class T>
struct cross_entropy_total {
  const T* logits;
  const std::int64_t* targets;
  const T* sums;
  T* lse;
  T* out;
  std::size_t rows;
  std::size_t v;
  vocab_span range;
  bool owner;
  T scale; ///< 1 for a sum, 1 / the whole batch's rows for a mean
  HSPMD_HD void operator()(std::size_t /*i*/) const {
    T total{0};
    for (std::size_t r = 0; r < rows; ++r) {
      const auto t = static_cast<std::size_t>(targets[r]);
      lse[r] += std::log(sums[r]);
      if (owner)
        total += lse[r];
      if (t >= range.first && t < range.first + range.count)
        total -= logits[r * v + t - range.first];
    }
    out[0] = scale * total;
  }
};
/// Row r of the logits' gradient: dlogits[r, j] += scale * dy * (softmax(logits)[r, j] - [j is
/// the target]).
template <class T>
struct cross_entropy_backward {
  const T* logits;
  const std::int64_t* targets;
  const T* lse;
  const T* dy;
  T* dlogits;
  std::size_t v;
  vocab_span range;
  T scale;
  bool assign = false;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& team) const {
    const T g = scale * dy[0];
    const T m = lse[r];
    const T* lr = logits + r * v;
    T* dr = dlogits + r * v;
    const auto t = static_cast<std::size_t>(targets[r]);
    const bool store = assign;
    team.for_each(v, [=](std::size_t j) { contribute(dr[j], g * math::exp(lr[j] - m), store); });
    // The target's -g, by the thread that wrote its element (program order: no race).
    if (t >= range.first && t < range.first + range.count && team.owns(t - range.first))
      dr[t - range.first] -= g;
  }
};

/// A mean divides by the whole batch's row count, kept in the node (a rank's piece divides by it
/// too, so the ranks' partial losses sum to the mean).
template <class T, class B>
[[nodiscard]] T loss_scale(const kernel_context<T, B>& c) {
  const double rows = c.node().attrs.scalar;
  return rows > 0.0 ? static_cast<T>(1.0 / rows) : T{1};
}

template <>
struct kernel<graph::op::cross_entropy> {
  static constexpr std::uint32_t assigns = 0b1; // the logits
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const std::size_t v = c.in_shape(0).dims[1];
    const auto range = vocab_range(c, 1);
    const program::node_layout* l = c.layout();
    const bool vocab_parallel = l != nullptr && l->vocab_parallel;
    const auto targets = c.ids(1);
    check_ids(c, targets, range.total, "target");
    const std::size_t rows = targets.size();
    T* lse = c.saved(2 * rows); // per row: log-sum-exp (kept for the backward), then the sums
    T* sums = lse + rows;
    auto& be = c.backend();
    if (vocab_parallel) { // the row maxima, then the sums, over every rank's piece
      for_each_row(be, rows, row_max<T>{c.in(0), lse, v});
      c.row_reduce(std::span<T>(lse, rows), true);
      for_each_row(be, rows, row_exp_sum<T>{c.in(0), lse, sums, v});
      c.row_reduce(std::span<T>(sums, rows), false);
    } else {
      for_each_row(be, rows, row_max_exp_sum<T>{c.in(0), lse, sums, v});
    }
    for_each_index(be, 1,
                   cross_entropy_total<T>{c.in(0), targets.data(), sums, lse, c.out(), rows, v,
                                          range, !vocab_parallel || l->owner, loss_scale<T>(c)});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const std::size_t v = c.in_shape(0).dims[1];
    const auto targets = c.ids(1);
    for_each_row(c.backend(), v == 0 ? 0 : targets.size(),
                 cross_entropy_backward<T>{c.in(0), targets.data(), c.saved(), c.dout(), c.din(0),
                                           v, vocab_range(c, 1), loss_scale<T>(c), c.assign(0)});
  }
};

} // namespace hspmd::exec
