#pragma once
// Kernels of top-2 mixture-of-experts routing (registry: graph/ops/moe.hpp).
//
// Routing, the same in dispatch and combine: for each token t, experts[2t] and experts[2t+1]
// are its two most probable experts (ties to the lower index) and slots[2t + k] the positions
// in their buffers, or `dropped` past the capacity. Slots are handed out to every token's first
// choice in token order, then to second choices, so first choices win when an expert is full.
// The gates are p_e / (p_e1 + p_e2).
//
// Sharded (a rank's local graph): token parallel routes the rank's tokens into its share of the
// capacity (the output's local capacity); hidden parallel routes every token and moves the
// rank's hidden columns; expert parallel (combine: the rank holds experts [first, first + held)
// of the buffers, all probabilities) routes every token, only the rank's experts contribute, and
// the output (and the probabilities' gradient) is a partial sum over ranks.

#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <cstddef>

namespace hspmd::exec {

/// A routing choice that found its expert full.
inline constexpr std::size_t moe_dropped = static_cast<std::size_t>(-1);

/// Routes every token (one index: slots are handed out in order). Writes experts to
/// route[0, 2T), slots to route[2T, 4T); `fill` (E counters) is scratch.
template <class T>
struct route_top2 {
  const T* probs;
  std::size_t* route;
  std::size_t* fill;
  std::size_t tokens;
  std::size_t experts;
  std::size_t capacity;
  HSPMD_HD void operator()(std::size_t /*i*/) const {
    std::size_t* chosen = route;
    std::size_t* slots = route + 2 * tokens;
    for (std::size_t t = 0; t < tokens; ++t) {
      const T* p = probs + t * experts;
      std::size_t e1 = 0;
      for (std::size_t e = 1; e < experts; ++e)
        if (p[e] > p[e1])
          e1 = e;
      std::size_t e2 = e1 == 0 ? 1 : 0;
      for (std::size_t e = 0; e < experts; ++e)
        if (e != e1 && p[e] > p[e2])
          e2 = e;
      chosen[2 * t] = e1;
      chosen[2 * t + 1] = e2;
    }
    for (std::size_t e = 0; e < experts; ++e)
      fill[e] = 0;
    for (std::size_t k = 0; k < 2 * tokens; ++k)
      slots[k] = moe_dropped;
    for (std::size_t choice = 0; choice < 2; ++choice)
      for (std::size_t t = 0; t < tokens; ++t) {
        const std::size_t e = chosen[2 * t + choice];
        if (fill[e] < capacity)
          slots[2 * t + choice] = fill[e]++;
      }
  }
};

/// The routing of a dispatch or combine node into its saved index buffer: experts, slots.
template <class T, class B>
const std::size_t* route(kernel_context<T, B>& c, const T* probs, std::size_t tokens,
                         std::size_t experts, std::size_t capacity) {
  std::size_t* r = c.saved_index(4 * tokens + experts);
  for_each_index(c.backend(), 1,
                 route_top2<T>{probs, r, r + 4 * tokens, tokens, experts, capacity});
  return r;
}

/// Token t's row into its routed slots (forward), or the slots' gradient back (backward): one
/// index per (token, hidden column).
template <class T>
struct dispatch_rows {
  const std::size_t* route; // experts, then slots
  const T* src;
  T* dst;
  std::size_t tokens;
  std::size_t h;
  std::size_t capacity;
  bool backward;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t t = i / h;
    const std::size_t j = i % h;
    for (std::size_t k = 2 * t; k < 2 * t + 2; ++k) {
      const std::size_t slot = route[2 * tokens + k];
      if (slot == moe_dropped)
        continue;
      const std::size_t at = (route[k] * capacity + slot) * h + j;
      if (backward)
        dst[i] += src[at];
      else
        dst[at] = src[i];
    }
  }
};

/// Zeroes n elements.
template <class T>
struct zero_fill {
  T* out;
  HSPMD_HD void operator()(std::size_t i) const { out[i] = T{0}; }
};

// The routing is discrete: no gradient flows to the probabilities here (it does in combine).
template <>
struct kernel<graph::op::moe_dispatch> : two_way_kernel<kernel<graph::op::moe_dispatch>> {
  template <class T, class B>
  static void run(kernel_context<T, B>& c, bool backward) {
    const std::size_t tokens = c.in_shape(0).dims[0];
    const std::size_t h = c.in_shape(0).dims[1];
    const std::size_t capacity = c.out_shape().dims[1];
    const std::size_t* r =
        backward ? c.saved_index() : route(c, c.in(1), tokens, c.in_shape(1).dims[1], capacity);
    if (!backward)
      for_each_index(c.backend(), c.out_size(), zero_fill<T>{c.out()}); // unused slots are 0
    for_each_index(c.backend(), tokens * h,
                   dispatch_rows<T>{r, backward ? c.dout() : c.in(0), backward ? c.din(0) : c.out(),
                                    tokens, h, capacity, backward});
  }
};

/// What combine's functors share: the routing, the probabilities and the buffers' geometry.
template <class T>
struct combine_geometry {
  const std::size_t* route;
  const T* probs;
  std::size_t tokens, experts, capacity, h, first, held;
  // Buffer offset of token t's choice k (k in {0, 1}), or moe_dropped when it is not held here.
  [[nodiscard]] HSPMD_HD std::size_t at(std::size_t t, std::size_t k) const {
    const std::size_t slot = route[2 * tokens + 2 * t + k];
    const std::size_t e = route[2 * t + k];
    if (slot == moe_dropped || e < first || e >= first + held)
      return moe_dropped;
    return ((e - first) * capacity + slot) * h;
  }
  [[nodiscard]] HSPMD_HD T gate(std::size_t t, std::size_t k) const {
    const T p1 = probs[t * experts + route[2 * t]];
    const T p2 = probs[t * experts + route[2 * t + 1]];
    return (k == 0 ? p1 : p2) / (p1 + p2);
  }
};

/// y[t, j] = sum over t's held choices of gate * buffers[slot, j].
template <class T>
struct combine_forward {
  combine_geometry<T> g;
  const T* buffers;
  T* y;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t t = i / g.h;
    const std::size_t j = i % g.h;
    T acc{0};
    for (std::size_t k = 0; k < 2; ++k) {
      const std::size_t at = g.at(t, k);
      if (at != moe_dropped)
        acc += g.gate(t, k) * buffers[at + j];
    }
    y[i] = acc;
  }
};
/// d buffers[slot, j] += gate * dy[t, j]: one index per (token, choice, column).
template <class T>
struct combine_buffer_gradient {
  combine_geometry<T> g;
  const T* dy;
  T* dbuffers;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t t = i / (2 * g.h);
    const std::size_t k = i / g.h % 2;
    const std::size_t j = i % g.h;
    const std::size_t at = g.at(t, k);
    if (at != moe_dropped)
      dbuffers[at + j] += g.gate(t, k) * dy[t * g.h + j];
  }
};
/// Token t's probabilities' gradient: d g_k = dy . buffers[slot_k], through g_k = p_k / z.
template <class T>
struct combine_gate_gradient {
  combine_geometry<T> g;
  const T* dy;
  const T* buffers;
  T* dprobs;
  HSPMD_HD void operator()(std::size_t t) const {
    T dgate[2] = {T{0}, T{0}};
    for (std::size_t k = 0; k < 2; ++k) {
      const std::size_t at = g.at(t, k);
      if (at == moe_dropped)
        continue;
      for (std::size_t j = 0; j < g.h; ++j)
        dgate[k] += dy[t * g.h + j] * buffers[at + j];
    }
    const std::size_t e1 = g.route[2 * t];
    const std::size_t e2 = g.route[2 * t + 1];
    const T p1 = g.probs[t * g.experts + e1];
    const T p2 = g.probs[t * g.experts + e2];
    const T z = p1 + p2;
    dprobs[t * g.experts + e1] += (dgate[0] * p2 - dgate[1] * p2) / (z * z);
    dprobs[t * g.experts + e2] += (dgate[1] * p1 - dgate[0] * p1) / (z * z);
  }
};

template <>
struct kernel<graph::op::moe_combine> {
  template <class T, class B>
  static combine_geometry<T> geometry(kernel_context<T, B>& c, bool backward) {
    const std::size_t held = c.in_shape(0).dims[0];
    const std::size_t capacity = c.in_shape(0).dims[1];
    const std::size_t tokens = c.in_shape(1).dims[0];
    const std::size_t experts = c.in_shape(1).dims[1];
    const program::node_layout* buffers = c.in_layout(0);
    const std::size_t* r =
        backward ? c.saved_index() : route(c, c.in(1), tokens, experts, capacity);
    return {r,
            c.in(1),
            tokens,
            experts,
            capacity,
            c.in_shape(0).dims[2],
            buffers != nullptr ? buffers->offset_of(0) : 0,
            held};
  }
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto g = geometry(c, false);
    for_each_index(c.backend(), g.tokens * g.h, combine_forward<T>{g, c.in(0), c.out()});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const auto g = geometry(c, true);
    for_each_index(c.backend(), 2 * g.tokens * g.h,
                   combine_buffer_gradient<T>{g, c.dout(), c.din(0)});
    for_each_index(c.backend(), g.tokens, combine_gate_gradient<T>{g, c.dout(), c.in(0), c.din(1)});
  }
};

} // namespace hspmd::exec
