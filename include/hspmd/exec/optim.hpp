#pragma once
// Optimizers over an executor's parameters, and gradient clipping by the global norm.
//
//   sgd : v = momentum * v + g (+ weight_decay * w);  w -= lr * v
//   adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w -= lr * m^ / (sqrt(v^) + eps)
//         with bias-corrected m^, v^; `decoupled_weight_decay` (AdamW) subtracts lr * wd * w
//         separately instead of adding wd * w to the gradient.
//
// Each step is one fused pass over every parameter (an HSPMD_HD functor through the executor's
// backend): the gradient scaled by the clipping factor, the decay, the moments and the weight
// in one read and one write of each, in the parameter's element type; moment buffers are
// allocated at the first step and reused. Clipping needs the global norm first: one reduction
// over the gradients (`grad_norm_squared`, all-reduced across ranks in a sharded run), then
// `step(ex, clip_scale(norm, max_norm))` applies it inside the update, so the gradients are
// never rewritten. `clip_grad_norm` still scales the gradients in place for other optimizers.

#include <hspmd/core/fastmath.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/exec/executor.hpp>

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// Sum of squares of `g` in double, in `reduce_lanes` lanes (vectorized, fixed order).
template <std::floating_point T>
[[nodiscard]] double sum_of_squares(std::span<const T> g) {
  const T* p = g.data();
  return lane_sum<double>(g.size(), [p](std::size_t i) {
    const auto x = static_cast<double>(p[i]);
    return x * x;
  });
}

/// Partial sums of squares of a gradient: index c sums elements [c len, (c + 1) len) in double
/// (lanes, fixed order) into sums[c]. The reduction a device runs; the host sums the partials.
template <class T>
struct sum_of_squares_chunks {
  const T* g;
  std::size_t n;
  std::size_t len;
  double* sums;
  HSPMD_HD void operator()(std::size_t c) const {
    const std::size_t first = c * len;
    const std::size_t count = first >= n ? 0 : (n - first < len ? n - first : len);
    const T* p = g + first;
    sums[c] = lane_sum<double>(count, [p](std::size_t i) {
      const auto x = static_cast<double>(p[i]);
      return x * x;
    });
  }
};

/// Sum of squares of `g`, a buffer of backend `be`: in place for host memory; on a device, in
/// 4096-element chunks there and the partial sums read back (one small copy), so the result
/// equals the host's to rounding, not bit for bit.
template <std::floating_point T, backend B>
[[nodiscard]] double sum_of_squares_on(B& be, std::span<const T> g) {
  if constexpr (host_memory_v<B>) {
    return sum_of_squares(g);
  } else {
    constexpr std::size_t len = 4096;
    const std::size_t chunks = (g.size() + len - 1) / len;
    auto sums = be.template allocate<double>(chunks);
    for_each_index(be, chunks, sum_of_squares_chunks<T>{g.data(), g.size(), len, sums.data()});
    std::vector<double> partial(chunks);
    be.copy_to_host(partial.data(), sums.data(), chunks);
    double s = 0.0;
    for (double v : partial)
      s += v;
    return s;
  }
}

/// Sum of squared gradients over all parameters (`sum_of_squares_on` each).
template <std::floating_point T, backend B>
[[nodiscard]] double grad_norm_squared(executor<T, B>& ex) {
  double s = 0.0;
  for (graph::node_id id : ex.graph().parameters())
    s += sum_of_squares_on(ex.backend(), std::span<const T>(ex.grad(id)));
  return s;
}

/// g[i] *= f.
template <class T>
struct scale_in_place {
  T* g;
  T f;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const { g[i] *= f; }
};

namespace detail {
template <std::floating_point T, backend B>
void scale_gradients(executor<T, B>& ex, double f) {
  for (graph::node_id id : ex.graph().parameters()) {
    const std::span<T> g = ex.grad(id);
    for_each_index(ex.backend(), g.size(), scale_in_place<T>{g.data(), static_cast<T>(f)});
  }
}
} // namespace detail

/// The factor that brings gradients of global norm `norm` to at most `max_norm` (1 when
/// `max_norm` <= 0, the norm is within it, or the norm is 0).
[[nodiscard]] inline double clip_scale(double norm, double max_norm) {
  return max_norm > 0.0 && norm > max_norm && norm > 0.0 ? max_norm / norm : 1.0;
}

/// Scales all gradients so that their global L2 norm is at most `max_norm`; returns the norm
/// before clipping. `norm_squared` overrides the local sum (pass the all-reduced one in sharded
/// runs).
template <std::floating_point T, backend B>
double clip_grad_norm(executor<T, B>& ex, double max_norm, double norm_squared = -1.0) {
  const double norm = std::sqrt(norm_squared >= 0.0 ? norm_squared : grad_norm_squared(ex));
  const double f = clip_scale(norm, max_norm);
  if (f != 1.0)
    detail::scale_gradients(ex, f);
  return norm;
}

/// `opt.step(ex, grad_scale)` when the optimizer takes the clipping factor into its pass (sgd,
/// adam); otherwise the gradients are scaled first and `opt.step(ex)` runs.
template <class Optimizer, std::floating_point T, backend B>
void step_scaled(Optimizer& opt, executor<T, B>& ex, double grad_scale) {
  if constexpr (requires { opt.step(ex, grad_scale); }) {
    opt.step(ex, grad_scale);
  } else {
    if (grad_scale != 1.0)
      detail::scale_gradients(ex, grad_scale);
    opt.step(ex);
  }
}

/// One element of SGD's fused update.
template <class T>
struct sgd_update {
  T* w;
  const T* g;
  T* v;
  T scale;
  T lr;
  T momentum;
  T decay;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const {
    const T gi = g[i] * scale + decay * w[i];
    const T vi = momentum * v[i] + gi;
    v[i] = vi;
    w[i] -= lr * vi;
  }
};

/// One element of Adam's fused update; `step_size` = lr / (1 - b1^t), `inv_sqrt_c2` =
/// 1 / sqrt(1 - b2^t), `keep` = 1 - lr wd (AdamW) or 1, `l2` = wd (Adam's coupled decay) or 0.
template <class T>
struct adam_update {
  T* w;
  const T* g;
  T* m;
  T* v;
  T scale;
  T b1;
  T b2;
  T step_size;
  T inv_sqrt_c2;
  T eps;
  T keep;
  T l2;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const {
    const T wi = w[i];
    const T gi = g[i] * scale + l2 * wi;
    const T mi = b1 * m[i] + (T{1} - b1) * gi;
    const T vi = b2 * v[i] + (T{1} - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi * keep - step_size * mi / (math::sqrt(vi) * inv_sqrt_c2 + eps);
  }
};

namespace detail {
// Per-parameter state buffers of one element type on one backend, allocated once (zeroed).
template <class T, class B>
struct optimizer_slots {
  std::vector<typename B::template buffer<T>> a, b;
  void fit(B& be, std::size_t params, std::size_t p, std::size_t n, bool two) {
    if (a.size() != params) {
      a.resize(params);
      b.resize(params);
    }
    if (a[p].size() != n)
      a[p] = be.template allocate<T>(n);
    if (two && b[p].size() != n)
      b[p] = be.template allocate<T>(n);
  }
};
// The slots of each (element type, backend) an optimizer has stepped: one optimizer may step
// float and double executors, each keeping its own state.
class optimizer_state {
public:
  template <class T, class B>
  optimizer_slots<T, B>& of() {
    const void* tag = &tag_of<T, B>;
    for (auto& [t, slots] : slots_)
      if (t == tag)
        return *static_cast<optimizer_slots<T, B>*>(slots.get());
    auto slots = std::make_shared<optimizer_slots<T, B>>();
    auto& ref = *slots;
    slots_.emplace_back(tag, std::move(slots));
    return ref;
  }

private:
  template <class T, class B>
  static constexpr char tag_of = 0; // one address per (T, B)
  std::vector<std::pair<const void*, std::shared_ptr<void>>> slots_;
};
} // namespace detail

/// Stochastic gradient descent with momentum and L2 weight decay.
class sgd {
public:
  explicit sgd(double learning_rate = 0.01, double momentum_factor = 0.0, double decay = 0.0)
      : lr(learning_rate), momentum(momentum_factor), weight_decay(decay) {}

  double lr;
  double momentum;
  double weight_decay;

  /// One step over every parameter; the gradients are read times `grad_scale` (the clipping
  /// factor, see `clip_scale`).
  template <std::floating_point T, backend B>
  void step(executor<T, B>& ex, double grad_scale = 1.0) {
    const auto params = ex.graph().parameters();
    auto& slots = state_.of<T, B>();
    for (std::size_t p = 0; p < params.size(); ++p) {
      auto w = ex.value(params[p]);
      slots.fit(ex.backend(), params.size(), p, w.size(), false);
      for_each_index(ex.backend(), w.size(),
                     sgd_update<T>{w.data(), ex.grad(params[p]).data(), slots.a[p].data(),
                                   static_cast<T>(grad_scale), static_cast<T>(lr),
                                   static_cast<T>(momentum), static_cast<T>(weight_decay)});
    }
  }

  /// The momentum buffers (slot `a` per parameter, in the executor's parameter order), for
  /// moving them to a new layout (exec/reshard.hpp).
  [[nodiscard]] detail::optimizer_state& state() noexcept { return state_; }
  static constexpr std::size_t state_slots = 1; ///< slots in use per parameter (a)
  /// The slots' names in checkpoints (PyTorch's).
  static constexpr std::array<std::string_view, 1> state_names = {"momentum_buffer"};
  static constexpr std::string_view kind = "sgd";

private:
  detail::optimizer_state state_;
};

/// Adam, or AdamW with `decoupled_weight_decay`.
class adam {
public:
  explicit adam(double learning_rate = 1e-3, double b1 = 0.9, double b2 = 0.999,
                double epsilon = 1e-8, double decay = 0.0, bool decoupled = true)
      : lr(learning_rate), beta1(b1), beta2(b2), eps(epsilon), weight_decay(decay),
        decoupled_weight_decay(decoupled) {}

  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  bool decoupled_weight_decay;

  /// One step over every parameter; the gradients are read times `grad_scale` (the clipping
  /// factor, see `clip_scale`).
  template <std::floating_point T, backend B>
  void step(executor<T, B>& ex, double grad_scale = 1.0) {
    const auto params = ex.graph().parameters();
    auto& slots = state_.of<T, B>();
    ++t_;
    const double c1 = 1.0 - std::pow(beta1, static_cast<double>(t_));
    const double c2 = 1.0 - std::pow(beta2, static_cast<double>(t_));
    const auto keep = static_cast<T>(decoupled_weight_decay ? 1.0 - lr * weight_decay : 1.0);
    const auto l2 = static_cast<T>(decoupled_weight_decay ? 0.0 : weight_decay);
    for (std::size_t p = 0; p < params.size(); ++p) {
      auto w = ex.value(params[p]);
      slots.fit(ex.backend(), params.size(), p, w.size(), true);
      for_each_index(ex.backend(), w.size(),
                     adam_update<T>{w.data(), ex.grad(params[p]).data(), slots.a[p].data(),
                                    slots.b[p].data(), static_cast<T>(grad_scale),
                                    static_cast<T>(beta1), static_cast<T>(beta2),
                                    static_cast<T>(lr / c1), static_cast<T>(1.0 / std::sqrt(c2)),
                                    static_cast<T>(eps), keep, l2});
    }
  }

  /// The moments (slots `a` and `b` per parameter, in the executor's parameter order), for
  /// moving them to a new layout (exec/reshard.hpp); the step count stays.
  [[nodiscard]] detail::optimizer_state& state() noexcept { return state_; }
  static constexpr std::size_t state_slots = 2; ///< slots in use per parameter (a, b)
  /// The slots' names in checkpoints (PyTorch's).
  static constexpr std::array<std::string_view, 2> state_names = {"exp_avg", "exp_avg_sq"};
  static constexpr std::string_view kind = "adam";
  /// Steps taken (bias correction's t), for checkpoints.
  [[nodiscard]] std::size_t steps() const noexcept { return t_; }
  void set_steps(std::size_t t) noexcept { t_ = t; }

private:
  detail::optimizer_state state_;
  std::size_t t_ = 0;
};

} // namespace hspmd::exec
