#pragma once
// Dense LU factorization with partial pivoting, for re-inverting simplex bases. Small problems
// only (the sharding LPs have tens of rows); O(n^3) to factor, O(n^2) per solve.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace hspmd::lp::detail {

/// P A = L U of a square matrix, row-major.
class dense_lu {
public:
  /// Factors `a` (n x n, row-major). Returns false when a pivot is below `tiny` times the
  /// largest entry of its column: the matrix is singular for our purposes.
  bool factor(std::vector<double> a, std::size_t n, double tiny = 1e-11) {
    n_ = n;
    lu_ = std::move(a);
    perm_.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      perm_[i] = i;
    for (std::size_t k = 0; k < n; ++k) {
      std::size_t p = k;
      double best = std::abs(lu_[k * n + k]);
      double column_max = best;
      for (std::size_t i = k + 1; i < n; ++i) {
        const double v = std::abs(lu_[i * n + k]);
        column_max = std::max(column_max, v);
        if (v > best) {
          best = v;
          p = i;
        }
      }
      if (!(best > tiny * std::max(1.0, column_max)) || best == 0.0)
        return false;
      if (p != k) {
        for (std::size_t j = 0; j < n; ++j)
          std::swap(lu_[k * n + j], lu_[p * n + j]);
        std::swap(perm_[k], perm_[p]);
      }
      const double pivot = lu_[k * n + k];
      for (std::size_t i = k + 1; i < n; ++i) {
        const double f = lu_[i * n + k] / pivot;
        lu_[i * n + k] = f;
        if (f == 0.0)
          continue;
        for (std::size_t j = k + 1; j < n; ++j)
          lu_[i * n + j] -= f * lu_[k * n + j];
      }
    }
    return true;
  }

  /// Solves A x = b in place (b becomes x).
  void solve(std::span<double> b) const {
    const std::size_t n = n_;
    std::vector<double> y(n);
    for (std::size_t i = 0; i < n; ++i)
      y[i] = b[perm_[i]];
    for (std::size_t i = 0; i < n; ++i) // L y = P b
      for (std::size_t j = 0; j < i; ++j)
        y[i] -= lu_[i * n + j] * y[j];
    for (std::size_t ii = n; ii-- > 0;) { // U x = y
      for (std::size_t j = ii + 1; j < n; ++j)
        y[ii] -= lu_[ii * n + j] * y[j];
      y[ii] /= lu_[ii * n + ii];
    }
    for (std::size_t i = 0; i < n; ++i)
      b[i] = y[i];
  }

private:
  std::size_t n_ = 0;
  std::vector<double> lu_;
  std::vector<std::size_t> perm_;
};

} // namespace hspmd::lp::detail
