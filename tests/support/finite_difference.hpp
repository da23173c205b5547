#pragma once
// Central finite differences for gradient checks in f64.
#include <hspmd/exec/executor.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

namespace test_support {

/// The worst relative error between the executor's gradients of `nodes` (computed by the
/// caller's forward + backward) and central differences of the loss, sampling about
/// `samples` elements per node. Relative to max(|numeric|, |analytic|, 1e-2).
inline double worst_gradient_error(hspmd::exec::executor<double>& ex,
                                   const std::vector<hspmd::graph::node_id>& nodes,
                                   std::size_t samples = 40) {
  double worst = 0.0;
  for (hspmd::graph::node_id id : nodes) {
    auto v = ex.value(id);
    const std::vector<double> analytic(ex.grad(id).begin(), ex.grad(id).end());
    for (std::size_t i = 0; i < v.size(); i += 1 + v.size() / samples) {
      const double x0 = v[i];
      const double h = 1e-6 * std::max(1.0, std::abs(x0));
      v[i] = x0 + h;
      const double fp = ex.forward();
      v[i] = x0 - h;
      const double fm = ex.forward();
      v[i] = x0;
      const double numeric = (fp - fm) / (2 * h);
      worst = std::max(worst, std::abs(numeric - analytic[i]) /
                                  std::max({std::abs(numeric), std::abs(analytic[i]), 1e-2}));
    }
  }
  return worst;
}

} // namespace test_support
