#pragma once
// Optimizers over an executor's parameters, and gradient clipping by the global norm.
//
//   sgd : v = momentum * v + g (+ weight_decay * w);  w -= lr * v
//   adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w -= lr * m^ / (sqrt(v^) + eps)
//         with bias-corrected m^, v^; `decoupled_weight_decay` (AdamW) subtracts lr * wd * w
//         separately instead of adding wd * w to the gradient.
//
// In a sharded run every rank updates its own shards; the global norm for clipping must then be
// summed over ranks first (`clip_grad_norm` takes the already-reduced squared norm there).

#include <hspmd/exec/executor.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <vector>

namespace hspmd::exec {

/// Sum of squared gradients over all parameters.
template <std::floating_point T>
[[nodiscard]] double grad_norm_squared(const executor<T>& ex) {
  double s = 0.0;
  for (graph::node_id id : ex.graph().parameters())
    for (T g : ex.grad(id))
      s += static_cast<double>(g) * static_cast<double>(g);
  return s;
}

/// Scales all gradients so that their global L2 norm is at most `max_norm`; returns the norm
/// before clipping. `norm_squared` overrides the local sum (pass the all-reduced one in sharded
/// runs).
template <std::floating_point T>
double clip_grad_norm(executor<T>& ex, double max_norm, double norm_squared = -1.0) {
  const double norm = std::sqrt(norm_squared >= 0.0 ? norm_squared : grad_norm_squared(ex));
  if (norm > max_norm && norm > 0.0) {
    const auto f = static_cast<T>(max_norm / norm);
    for (graph::node_id id : ex.graph().parameters())
      for (T& g : ex.grad(id))
        g *= f;
  }
  return norm;
}

/// Stochastic gradient descent with momentum and L2 weight decay.
class sgd {
public:
  explicit sgd(double learning_rate = 0.01, double momentum_factor = 0.0, double decay = 0.0)
      : lr(learning_rate), momentum(momentum_factor), weight_decay(decay) {}

  double lr;
  double momentum;
  double weight_decay;

  template <std::floating_point T>
  void step(executor<T>& ex) {
    const auto params = ex.graph().parameters();
    velocity_.resize(params.size());
    for (std::size_t p = 0; p < params.size(); ++p) {
      auto w = ex.value(params[p]);
      const auto g = ex.grad(params[p]);
      auto& v = velocity_[p];
      v.resize(w.size(), 0.0);
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double gi = static_cast<double>(g[i]) + weight_decay * static_cast<double>(w[i]);
        v[i] = momentum * v[i] + gi;
        w[i] = static_cast<T>(static_cast<double>(w[i]) - lr * v[i]);
      }
    }
  }

private:
  std::vector<std::vector<double>> velocity_;
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

  template <std::floating_point T>
  void step(executor<T>& ex) {
    const auto params = ex.graph().parameters();
    m_.resize(params.size());
    v_.resize(params.size());
    ++t_;
    const double c1 = 1.0 - std::pow(beta1, static_cast<double>(t_));
    const double c2 = 1.0 - std::pow(beta2, static_cast<double>(t_));
    for (std::size_t p = 0; p < params.size(); ++p) {
      auto w = ex.value(params[p]);
      const auto g = ex.grad(params[p]);
      m_[p].resize(w.size(), 0.0);
      v_[p].resize(w.size(), 0.0);
      for (std::size_t i = 0; i < w.size(); ++i) {
        double wi = static_cast<double>(w[i]);
        double gi = static_cast<double>(g[i]);
        if (!decoupled_weight_decay)
          gi += weight_decay * wi;
        m_[p][i] = beta1 * m_[p][i] + (1.0 - beta1) * gi;
        v_[p][i] = beta2 * v_[p][i] + (1.0 - beta2) * gi * gi;
        const double update = (m_[p][i] / c1) / (std::sqrt(v_[p][i] / c2) + eps);
        if (decoupled_weight_decay)
          wi -= lr * weight_decay * wi;
        w[i] = static_cast<T>(wi - lr * update);
      }
    }
  }

private:
  std::vector<std::vector<double>> m_, v_;
  std::size_t t_ = 0;
};

} // namespace hspmd::exec
