#pragma once
// A dense two-phase primal simplex with bounded variables.
//
// The standard form and its scaling are in standard_form.hpp.
//
// Phase 1 starts from the identity: a row's slack where it has coefficient +1, an artificial
// variable otherwise, and minimizes the sum of the artificials (no big-M). Artificials still basic
// at zero afterwards are pivoted out where the row allows; a row that allows no pivot is redundant
// and keeps its artificial fixed at zero. Phase 2 minimizes the real objective.
//
// Pricing is Dantzig's (most negative reduced cost); after a run of degenerate pivots it switches
// to Bland's rule (lowest index), which cannot cycle, until a pivot makes progress. The ratio test
// takes the smallest step within a tolerance and breaks ties by the lowest variable index;
// entering variables may also just move to their other bound ("bound flip"). The tableau is
// re-inverted from the original data every 50 pivots (or every row count, when larger). The
// optimal answer is checked against the original data by its residuals (confirm_by_residuals);
// where that cannot vouch for it, it is recomputed from an LU factorization of the basis
// (confirm). Either way the answer is re-checked against the original rows and bounds.
//
// Nothing here throws for an infeasible or unbounded problem: the status says so. The same input
// gives bit-identical output on every rank and every run.

#include <hspmd/lp/problem.hpp>
#include <hspmd/lp/revised.hpp>
#include <hspmd/lp/standard_form.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::lp {

/// Solves `p` (defined at the end of this file).
[[nodiscard]] result solve(const problem& p, const options& opt = {}, const basis* warm = nullptr);

namespace detail {

/// LU factors with partial pivoting of a dense m x m basis, P B = L U, for the dense tableau's
/// checks (a dense basis gains nothing from the sparse factorization's bookkeeping).
class dense_lu {
public:
  /// Factorizes the matrix whose column k holds the entries `columns(k, add)` passes to
  /// add(row, value). Returns false when it is singular (no pivot above 1e-11 of its column).
  template <class Columns>
  bool factor(std::size_t m, Columns&& columns) {
    m_ = m;
    a_.assign(m * m, 0.0);
    for (std::size_t k = 0; k < m; ++k)
      columns(k, [&](std::size_t i, double v) { a_[i * m + k] += v; });
    swap_.resize(m);
    for (std::size_t k = 0; k < m; ++k) {
      std::size_t p = k;
      double big = 0.0;
      for (std::size_t i = k; i < m; ++i)
        if (const double v = std::abs(a_[i * m + k]); v > big) {
          big = v;
          p = i;
        }
      if (!(big > 1e-11))
        return false;
      swap_[k] = p;
      if (p != k)
        std::swap_ranges(a_.begin() + static_cast<std::ptrdiff_t>(k * m),
                         a_.begin() + static_cast<std::ptrdiff_t>((k + 1) * m),
                         a_.begin() + static_cast<std::ptrdiff_t>(p * m));
      const double* rk = &a_[k * m];
      for (std::size_t i = k + 1; i < m; ++i) {
        double* ri = &a_[i * m];
        if (ri[k] == 0.0)
          continue;
        const double l = ri[k] / rk[k];
        ri[k] = l;
        for (std::size_t j = k + 1; j < m; ++j)
          ri[j] -= l * rk[j];
      }
    }
    return true;
  }

  /// Solves B x = a: `a` by row in (used as work space), x by basis position out.
  void ftran(std::vector<double>& a, std::vector<double>& x) const {
    for (std::size_t k = 0; k < m_; ++k)
      std::swap(a[k], a[swap_[k]]);
    for (std::size_t i = 0; i < m_; ++i) {
      double s = a[i];
      for (std::size_t j = 0; j < i; ++j)
        s -= a_[i * m_ + j] * a[j];
      a[i] = s;
    }
    x.assign(m_, 0.0);
    for (std::size_t i = m_; i-- > 0;) {
      double s = a[i];
      for (std::size_t j = i + 1; j < m_; ++j)
        s -= a_[i * m_ + j] * x[j];
      x[i] = s / a_[i * m_ + i];
    }
  }

  /// Solves y B = c: `c` by basis position in (used as work space), y by row out.
  void btran(std::vector<double>& c, std::vector<double>& y) const {
    for (std::size_t k = 0; k < m_; ++k) { // U^T z = c, by rows of U
      const double z = c[k] / a_[k * m_ + k];
      c[k] = z;
      if (z != 0.0)
        for (std::size_t j = k + 1; j < m_; ++j)
          c[j] -= z * a_[k * m_ + j];
    }
    for (std::size_t k = m_; k-- > 0;) { // L^T w = z, by rows of L
      const double w = c[k];
      if (w != 0.0)
        for (std::size_t j = 0; j < k; ++j)
          c[j] -= w * a_[k * m_ + j];
    }
    for (std::size_t k = m_; k-- > 0;)
      std::swap(c[k], c[swap_[k]]);
    y.assign(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(m_));
  }

private:
  std::size_t m_ = 0;
  std::vector<double> a_; // row-major: L below the diagonal (unit), U on and above it
  std::vector<std::size_t> swap_;
};

class dense_simplex {
public:
  dense_simplex(const problem& p, const options& opt) : p_(p), opt_(opt) { build(); }

  result run(const lp::basis* warm) {
    result res;
    limit_ = opt_.iteration_limit != 0 ? opt_.iteration_limit : 50 * (m_ + n_) + 1000;
    bool phase2_direct = false;
    const warm_outcome w = warm != nullptr ? try_warm_start(*warm) : warm_outcome::rejected;
    if (w == warm_outcome::rejected)
      cold_start();
    res.warm_started = w != warm_outcome::rejected;
    // A cold start on slacks alone (no artificial basic) is already feasible.
    phase2_direct = w == warm_outcome::feasible ||
                    (w == warm_outcome::rejected &&
                     std::none_of(basic_.begin(), basic_.end(),
                                  [this](std::size_t c) { return is_artificial(c); }));
    if (!phase2_direct) {
      const lp::status s1 = phase(1);
      res.phase1_iterations = iterations_;
      if (s1 == status::iteration_limit)
        return finish(res, status::iteration_limit, "iteration limit reached in phase 1");
      if (s1 == status::numerical_trouble)
        return finish(res, s1, "the basis became singular in phase 1");
      if (phase1_infeasibility() > feasibility_scale())
        return finish(res, status::infeasible,
                      "phase 1 ended with artificial variables summing to " +
                          std::to_string(phase1_infeasibility()));
      drive_out_artificials();
    }
    lp::status s2 = phase(2);
    // Confirm from the original data (an LU factorization of the basis: values, duals, reduced
    // costs); a drifted tableau is re-inverted and gets a few more tries.
    for (int attempt = 0; s2 == status::optimal && attempt < 3; ++attempt) {
      if (confirm_by_residuals() || confirm())
        break;
      if (!refactor())
        return finish(res, status::numerical_trouble, "the optimal basis is singular");
      s2 = phase(2);
    }
    if (s2 == status::unbounded)
      return finish(res, status::unbounded, "the objective decreases without bound");
    if (s2 != status::optimal)
      return finish(res, s2,
                    s2 == status::iteration_limit ? "iteration limit reached in phase 2"
                                                  : "numerical trouble in phase 2");
    return finish(res, status::optimal, {});
  }

private:
  using kind = var_kind;

  // ---- standard form ----------------------------------------------------------------------------
  // The shared sparse standard form, expanded: structural and slack columns, then one artificial
  // per row (the identity) and one for warm starts.
  void build() {
    m_ = sf_.m;
    n_ = sf_.n;
    warm_col_ = n_ + m_;
    width_ = n_ + m_ + 1;
    pos_.resize(n_);
    var_at_.resize(n_);
    for (std::size_t j = 0; j < n_; ++j)
      pos_[j] = var_at_[j] = j;
    front_ = n_;
    a_.assign(m_ * width_, 0.0);
    for (std::size_t j = 0; j < n_; ++j)
      for (std::size_t e = sf_.start[j]; e < sf_.start[j + 1]; ++e)
        at(sf_.index[e], j) = sf_.value[e];
    for (std::size_t i = 0; i < m_; ++i)
      at(i, n_ + i) = 1.0;
    cost_ = std::move(sf_.cost); // the standard form's costs and bounds are not read again
    cost_.resize(width_, 0.0);
    upper_ = std::move(sf_.upper);
    upper_.resize(width_, inf);
    upper_[warm_col_] = 0.0;
  }

  // Column j of the data and the tableau lies at position col(j): the structural and slack
  // columns are kept with the nonbasic ones first, [0, front_), and the basic ones after them,
  // so that a pivot updates only the nonbasic part (a basic column is a unit column and stays
  // one); artificial columns keep their places.
  [[nodiscard]] std::size_t col(std::size_t j) const { return j < n_ ? pos_[j] : j; }
  double& at(std::size_t i, std::size_t j) { return a_[i * width_ + col(j)]; }
  [[nodiscard]] double at(std::size_t i, std::size_t j) const { return a_[i * width_ + col(j)]; }
  double& tab(std::size_t i, std::size_t j) { return t_[i * width_ + col(j)]; }
  [[nodiscard]] bool is_artificial(std::size_t j) const noexcept { return j >= n_; }

  // Swaps positions p and q of the data, the tableau (when it is there) and the maps.
  void swap_positions(std::size_t p, std::size_t q) {
    if (p == q)
      return;
    const bool tableau = t_.size() == a_.size();
    for (std::size_t i = 0; i < m_; ++i) {
      std::swap(a_[i * width_ + p], a_[i * width_ + q]);
      if (tableau)
        std::swap(t_[i * width_ + p], t_[i * width_ + q]);
    }
    std::swap(var_at_[p], var_at_[q]);
    pos_[var_at_[p]] = p;
    pos_[var_at_[q]] = q;
  }

  // Puts the nonbasic columns first (in their order), then the basic ones, for a new basis.
  void arrange() {
    front_ = 0;
    for (std::size_t j = 0; j < n_; ++j)
      if (!is_basic_[j])
        swap_positions(front_++, pos_[j]);
  }

  // ---- starting bases ---------------------------------------------------------------------------
  void cold_start() {
    basic_.assign(m_, none);
    is_basic_.assign(width_, false);
    at_upper_.assign(width_, false);
    for (std::size_t i = 0; i < m_; ++i) {
      // A slack with coefficient +1 after scaling and negation is a unit column: use it.
      basic_[i] = sf_.unit_slack(i) ? sf_.slack[i] : n_ + i;
      is_basic_[basic_[i]] = true;
    }
    for (std::size_t i = 0; i < m_; ++i)
      upper_[n_ + i] = basic_[i] == n_ + i ? inf : 0.0; // unused artificials stay at zero
    t_.clear();
    arrange();
    t_ = a_; // the starting basis is the identity
    beta_ = sf_.b;
    phase1_costs_.assign(width_, 0.0);
    for (std::size_t i = 0; i < m_; ++i)
      phase1_costs_[n_ + i] = 1.0;
  }

  enum class warm_outcome : unsigned char { rejected, feasible, needs_phase1 };

  // Starts from a caller's basis. When it is primal infeasible for this problem, one artificial
  // column  q = -B w  (w: how far each basic variable is outside its bounds) enters at value 1,
  // which puts every basic variable on its bound: a feasible start whose phase 1 only has to drive
  // that one artificial to zero, usually in a few pivots when the basis is close.
  warm_outcome try_warm_start(const lp::basis& w) {
    const auto& vars = p_.variables();
    const auto& rows = p_.rows();
    if (w.variables.size() != vars.size() || w.rows.size() != rows.size())
      return warm_outcome::rejected;
    basic_.clear();
    is_basic_.assign(width_, false);
    at_upper_.assign(width_, false);
    for (std::size_t j = 0; j < vars.size(); ++j) {
      const var_map& vm = sf_.vars[j];
      const basis_status s = w.variables[j];
      if (s == basis_status::basic) {
        basic_.push_back(vm.col);
      } else if (s == basis_status::at_upper) {
        // A mirrored variable at its upper bound is its standard column at zero.
        if (vm.k == kind::shifted && std::isfinite(upper_[vm.col]))
          at_upper_[vm.col] = true;
        else if (vm.k != kind::mirrored)
          return warm_outcome::rejected;
      } else if ((s == basis_status::at_lower && vm.k != kind::shifted) ||
                 (s == basis_status::free_zero && vm.k != kind::split)) {
        return warm_outcome::rejected; // no such bound to sit on
      }
    }
    for (std::size_t i = 0; i < m_; ++i) {
      if (w.rows[i] == basis_status::basic)
        basic_.push_back(sf_.slack[i] != none ? sf_.slack[i] : n_ + i);
    }
    if (basic_.size() != m_)
      return warm_outcome::rejected;
    for (std::size_t c : basic_)
      is_basic_[c] = true;
    for (std::size_t i = 0; i < m_; ++i)
      upper_[n_ + i] = 0.0; // the row artificials only ever sit at zero here
    phase1_costs_.assign(width_, 0.0);
    t_.clear();
    arrange();
    if (!refactor())
      return warm_outcome::rejected;
    if (primal_feasible())
      return warm_outcome::feasible;
    const double tol = feasibility_scale();
    std::vector<double> shift(m_, 0.0);
    std::size_t worst = 0;
    for (std::size_t i = 0; i < m_; ++i) {
      const double u = upper_[basic_[i]];
      if (beta_[i] < -tol)
        shift[i] = -beta_[i];
      else if (std::isfinite(u) && beta_[i] > u + tol * std::max(1.0, u))
        shift[i] = u - beta_[i];
      if (std::abs(shift[i]) > std::abs(shift[worst]))
        worst = i;
    }
    for (std::size_t r = 0; r < m_; ++r) { // q = -B w in the original (scaled) data
      double q = 0.0;
      for (std::size_t i = 0; i < m_; ++i)
        q -= at(r, basic_[i]) * shift[i];
      at(r, warm_col_) = q;
    }
    for (std::size_t i = 0; i < m_; ++i)
      tab(i, warm_col_) = -shift[i];
    upper_[warm_col_] = inf;
    phase1_costs_[warm_col_] = 1.0;
    costs_ = &phase1_costs_;
    compute_reduced_costs(*costs_);
    for (std::size_t i = 0; i < m_; ++i)
      beta_[i] += shift[i]; // the artificial at 1 moves every infeasible variable to its bound
    pivot(worst, warm_col_, shift[worst] < 0.0);
    beta_[worst] = 1.0;
    return warm_outcome::needs_phase1;
  }

  // ---- linear algebra ---------------------------------------------------------------------------
  // Rebuilds the tableau B^-1 [A | I] and the basic values from the original (scaled) data by
  // Gauss-Jordan elimination on the basic columns with partial pivoting: whole-row operations, so
  // the work (rows^2 x columns) runs over contiguous memory.
  bool refactor() {
    t_ = a_;
    std::vector<double> rhs = sf_.b;
    for (std::size_t j = 0; j < width_; ++j)
      if (!is_basic_[j] && at_upper_[j])
        for (std::size_t i = 0; i < m_; ++i)
          rhs[i] -= at(i, j) * upper_[j];
    for (std::size_t k = 0; k < m_; ++k) {
      const std::size_t at_k = col(basic_[k]); // its position
      std::size_t p = k;
      double best = 0.0;
      double column_max = 0.0;
      for (std::size_t i = 0; i < m_; ++i) {
        const double v = std::abs(t_[i * width_ + at_k]);
        if (i < k) // rows already pivoted hold zeros here up to rounding
          continue;
        column_max = std::max(column_max, v);
        if (v > best) {
          best = v;
          p = i;
        }
      }
      if (!(best > 1e-11 * std::max(1.0, column_max)))
        return false;
      if (p != k) {
        std::swap_ranges(t_.begin() + static_cast<std::ptrdiff_t>(k * width_),
                         t_.begin() + static_cast<std::ptrdiff_t>((k + 1) * width_),
                         t_.begin() + static_cast<std::ptrdiff_t>(p * width_));
        std::swap(rhs[k], rhs[p]);
      }
      double* row_k = &t_[k * width_];
      const double inv = 1.0 / row_k[at_k];
      for (std::size_t j = 0; j < width_; ++j)
        row_k[j] *= inv;
      rhs[k] *= inv;
      for (std::size_t i = 0; i < m_; ++i) {
        if (i == k)
          continue;
        const double f = t_[i * width_ + at_k];
        if (f == 0.0)
          continue;
        double* row_i = &t_[i * width_];
        for (std::size_t j = 0; j < width_; ++j)
          row_i[j] -= f * row_k[j];
        rhs[i] -= f * rhs[k];
      }
    }
    beta_ = std::move(rhs);
    since_refactor_ = 0;
    return true;
  }

  // Reduced costs of the structural and slack columns (artificials never enter, and the duals
  // come from an LU solve: their tableau columns are not kept up to date after the start).
  void compute_reduced_costs(const std::vector<double>& c) {
    d_.assign(width_, 0.0);
    price_rows(c, t_, d_);
  }

  // d = c - c_B B^-1 [rows] over the nonbasic positions by rows of `rows` (the tableau with the
  // basic costs, or the data with duals: `weight(i)`), written by column; basic ones are zero.
  template <class Weight>
  void price_rows(const std::vector<double>& c, const std::vector<double>& rows, Weight&& weight,
                  std::vector<double>& d) {
    std::vector<double>& w = pivot_column_;
    w.resize(front_);
    for (std::size_t p = 0; p < front_; ++p)
      w[p] = c[var_at_[p]];
    for (std::size_t i = 0; i < m_; ++i) // by rows: contiguous
      if (const double y = weight(i); y != 0.0) {
        const double* row = &rows[i * width_];
        for (std::size_t p = 0; p < front_; ++p)
          w[p] -= y * row[p];
      }
    for (std::size_t p = 0; p < front_; ++p)
      d[var_at_[p]] = w[p];
  }
  void price_rows(const std::vector<double>& c, const std::vector<double>& rows,
                  std::vector<double>& d) {
    price_rows(
        c, rows, [&](std::size_t i) { return c[basic_[i]]; }, d);
  }

  [[nodiscard]] double feasibility_scale() const { return sf_.feasibility_scale(opt_); }

  [[nodiscard]] bool primal_feasible() const {
    return within_bounds(beta_, basic_, upper_, feasibility_scale());
  }

  [[nodiscard]] bool dual_feasible() const {
    for (std::size_t j = 0; j < n_; ++j)
      if (!is_basic_[j] && improving(j))
        return false;
    return true;
  }

  // A nonbasic column whose move improves the objective beyond the tolerance.
  [[nodiscard]] bool improving(std::size_t j) const {
    if (upper_[j] == 0.0)
      return false; // fixed at zero
    return at_upper_[j] ? d_[j] > opt_.optimality_tolerance : d_[j] < -opt_.optimality_tolerance;
  }

  [[nodiscard]] double phase1_infeasibility() const {
    double w = 0.0;
    for (std::size_t i = 0; i < m_; ++i)
      if (is_artificial(basic_[i]))
        w += std::max(0.0, beta_[i]);
    return w;
  }

  // ---- iterations ------------------------------------------------------------------------------
  lp::status phase(int which) {
    costs_ = which == 1 ? &phase1_costs_ : &cost_;
    compute_reduced_costs(*costs_);
    std::size_t degenerate = 0;
    while (true) {
      if (iterations_ >= limit_)
        return status::iteration_limit;
      const bool bland = degenerate >= opt_.degenerate_run;
      // Pricing: Dantzig (largest |d|) or Bland (lowest index).
      std::size_t enter = none;
      double best = 0.0;
      for (std::size_t j = 0; j < n_; ++j) {
        if (is_basic_[j] || !improving(j))
          continue;
        if (bland) {
          enter = j;
          break;
        }
        if (std::abs(d_[j]) > best) {
          best = std::abs(d_[j]);
          enter = j;
        }
      }
      if (enter == none)
        return status::optimal;
      const double dir = at_upper_[enter] ? -1.0 : 1.0;

      const auto [theta, leave, leave_at_upper] =
          ratio_test([&](std::size_t i) { return tab(i, enter); }, dir, upper_[enter], beta_,
                     basic_, upper_, opt_.pivot_tolerance);
      if (!std::isfinite(theta))
        return status::unbounded;
      ++iterations_;
      degenerate = theta <= 1e-12 ? degenerate + 1 : 0;

      for (std::size_t i = 0; i < m_; ++i)
        beta_[i] -= theta * dir * tab(i, enter);
      if (leave == none) { // bound flip: no basis change
        at_upper_[enter] = !at_upper_[enter];
        continue;
      }
      const double entering_value = dir > 0.0 ? theta : upper_[enter] - theta;
      pivot(leave, enter, leave_at_upper);
      beta_[leave] = entering_value;
      if (++since_refactor_ >= std::max<std::size_t>(50, m_)) {
        if (!refactor())
          return status::numerical_trouble;
        compute_reduced_costs(*costs_);
      }
    }
  }

  // Makes column `enter` basic in row `r`; the leaving variable becomes nonbasic at its upper
  // bound when `leaves_at_upper`, else at zero. The caller sets the entering variable's value.
  void pivot(std::size_t r, std::size_t enter, bool leaves_at_upper) {
    const std::size_t leaving = basic_[r];
    const double p = tab(r, enter);
    // Only the nonbasic structural and slack columns are updated (see compute_reduced_costs);
    // the entering column may be the warm-start artificial, read here before the update.
    std::vector<double>& f = pivot_column_;
    f.resize(m_);
    for (std::size_t i = 0; i < m_; ++i)
      f[i] = i == r ? 0.0 : tab(i, enter);
    // The leaving column (a unit column, exactly) takes the entering one's place among the
    // nonbasic positions, where the update below gives it its values; with an artificial on one
    // side the nonbasic part shrinks or grows by one instead.
    std::size_t basic_pos = none; // where the entering column lies after the update
    if (enter < n_ && leaving < n_) {
      basic_pos = pos_[leaving];
      swap_positions(pos_[enter], basic_pos);
    } else if (enter < n_) {
      basic_pos = --front_;
      swap_positions(pos_[enter], basic_pos);
    } else if (leaving < n_) {
      swap_positions(pos_[leaving], front_++);
    }
    double* row_r = &t_[r * width_];
    for (std::size_t j = 0; j < front_; ++j)
      row_r[j] /= p;
    for (std::size_t i = 0; i < m_; ++i) {
      if (f[i] == 0.0)
        continue;
      double* row_i = &t_[i * width_];
      const double fi = f[i];
      for (std::size_t j = 0; j < front_; ++j)
        row_i[j] -= fi * row_r[j];
    }
    if (basic_pos != none)
      for (std::size_t i = 0; i < m_; ++i)
        t_[i * width_ + basic_pos] = i == r ? 1.0 : 0.0;
    const double fd = d_[enter];
    if (fd != 0.0)
      for (std::size_t j = 0; j < front_; ++j)
        d_[var_at_[j]] -= fd * row_r[j];
    d_[enter] = 0.0;
    is_basic_[leaving] = false;
    at_upper_[leaving] = leaves_at_upper;
    is_basic_[enter] = true;
    at_upper_[enter] = false;
    basic_[r] = enter;
  }

  void drive_out_artificials() {
    bool pivoted = false;
    for (std::size_t r = 0; r < m_; ++r) {
      if (!is_artificial(basic_[r]))
        continue;
      std::size_t best = none;
      double big = 1e-7;
      for (std::size_t j = 0; j < n_; ++j) {
        if (is_basic_[j])
          continue;
        if (std::abs(tab(r, j)) > big) {
          big = std::abs(tab(r, j));
          best = j;
        }
      }
      if (best == none)
        continue;            // a redundant row: its artificial stays basic, fixed at zero
      pivot(r, best, false); // degenerate: the artificial leaves at zero
      pivoted = true;
    }
    for (std::size_t i = 0; i < m_; ++i)
      upper_[n_ + i] = 0.0;
    upper_[warm_col_] = 0.0;
    if (pivoted)
      refactor(); // the entering columns kept their bound values: recompute the basic ones
  }

  // ---- answer ----------------------------------------------------------------------------------
  [[nodiscard]] std::vector<double> std_values() const {
    std::vector<double> v(width_, 0.0);
    for (std::size_t j = 0; j < width_; ++j)
      if (!is_basic_[j] && at_upper_[j])
        v[j] = upper_[j];
    for (std::size_t i = 0; i < m_; ++i)
      v[basic_[i]] = beta_[i];
    return v;
  }

  result finish(result& res, lp::status s, std::string message) { // moves res out
    const std::vector<double>& c = costs_ == nullptr ? cost_ : *costs_;
    if (d_.size() != width_)
      compute_reduced_costs(c);
    if (!confirmed_) { // the duals y = c_B B^-1 (zero if the basis will not factorize)
      y_.assign(m_, 0.0);
      if (factor_basis()) {
        work_.resize(m_);
        for (std::size_t k = 0; k < m_; ++k)
          work_[k] = c[basic_[k]];
        lu_.btran(work_, y_);
      }
    }
    const std::vector<double> v = std_values();
    res.iterations = iterations_;
    return std::move(
        answer(res, p_, opt_, sf_, {v, d_, is_basic_, at_upper_, y_}, s, std::move(message)));
  }

  // LU factors of the basis from the original (scaled) data.
  bool factor_basis() {
    return lu_.factor(m_, [&](std::size_t k, auto&& add) {
      const double* column = &a_[col(basic_[k])];
      for (std::size_t i = 0; i < m_; ++i)
        if (const double v = column[i * width_]; v != 0.0)
          add(i, v);
    });
  }

  // Checks the tableau's optimal answer against the original (scaled) data by its residuals, with
  // no factorization: the basic values must solve B x_B = b - N x_N and the duals y B = c_B, each
  // within its tolerance, and the reduced costs recomputed from those duals must still be
  // optimal. The duals come from the slacks' reduced costs (a slack's is minus its row's dual
  // times its coefficient, zero when it is basic), so every row needs a slack and no artificial
  // may be basic; otherwise, or when a check fails, confirm() recomputes the answer from an LU
  // factorization. A tableau that passes is an exact answer of a problem within the tolerances
  // of this one (the backward error the factorization's answer has too), at the cost of one pass
  // over the nonzeros.
  bool confirm_by_residuals() {
    confirmed_ = false;
    for (std::size_t i = 0; i < m_; ++i)
      if (sf_.slack[i] == none || is_artificial(basic_[i]))
        return false;
    if (!primal_feasible())
      return false;
    const std::vector<double> v = std_values();
    std::vector<double>& r = work_;
    r = sf_.b;
    for (std::size_t j = 0; j < n_; ++j)
      if (const double x = v[j]; x != 0.0)
        for (std::size_t e = sf_.start[j]; e < sf_.start[j + 1]; ++e)
          r[sf_.index[e]] -= sf_.value[e] * x;
    const double primal_tol = feasibility_scale();
    for (std::size_t i = 0; i < m_; ++i)
      if (!(std::abs(r[i]) <= primal_tol))
        return false;
    std::vector<double> y(m_, 0.0);
    for (std::size_t i = 0; i < m_; ++i)
      if (const std::size_t s = sf_.slack[i]; !is_basic_[s])
        y[i] = -d_[s] / sf_.value[sf_.start[s]];
    std::vector<double> d(width_, 0.0);
    for (std::size_t j = 0; j < n_; ++j) {
      double dj = cost_[j];
      for (std::size_t e = sf_.start[j]; e < sf_.start[j + 1]; ++e)
        dj -= sf_.value[e] * y[sf_.index[e]];
      if (!is_basic_[j])
        d[j] = dj;
      else if (!(std::abs(dj) <= opt_.optimality_tolerance))
        return false;
    }
    std::swap(d, d_);
    if (!dual_feasible()) {
      std::swap(d, d_);
      return false;
    }
    y_ = std::move(y);
    confirmed_ = true;
    return true;
  }

  // Recomputes the basic values, the duals and the reduced costs of the phase-2 objective from
  // the original data through an LU factorization of the basis (about m^3 / 3 work against the
  // m^2 x columns of re-inverting the tableau) and says whether they are still optimal. When
  // they are, they replace the tableau's.
  bool confirm() {
    confirmed_ = false;
    if (!factor_basis())
      return false;
    work_ = sf_.b;
    for (std::size_t j = 0; j < width_; ++j)
      if (!is_basic_[j] && at_upper_[j])
        for (std::size_t i = 0; i < m_; ++i)
          work_[i] -= at(i, j) * upper_[j];
    std::vector<double> beta;
    lu_.ftran(work_, beta);
    work_.resize(m_);
    for (std::size_t k = 0; k < m_; ++k)
      work_[k] = cost_[basic_[k]];
    std::vector<double> y;
    lu_.btran(work_, y);
    std::vector<double> d(width_, 0.0);
    price_rows(
        cost_, a_, [&](std::size_t i) { return y[i]; }, d);
    std::swap(beta, beta_);
    std::swap(d, d_);
    if (!primal_feasible() || !dual_feasible()) {
      std::swap(beta, beta_);
      std::swap(d, d_);
      return false;
    }
    y_ = std::move(y);
    confirmed_ = true;
    return true;
  }

  const problem& p_;
  const options& opt_;
  std::size_t m_ = 0;     // rows
  std::size_t n_ = 0;     // structural + slack columns
  std::size_t width_ = 0; // n_ + m_ row artificials + 1 warm-start artificial
  std::size_t warm_col_ = 0;
  standard_form sf_{p_, opt_};
  std::vector<double> a_, cost_, upper_;
  dense_lu lu_;
  std::vector<double> work_, y_, pivot_column_;
  bool confirmed_ = false;
  std::vector<double> t_, beta_, d_, phase1_costs_;
  const std::vector<double>* costs_ = nullptr; // the phase's costs
  std::vector<std::size_t> basic_;
  std::vector<std::size_t> pos_, var_at_; // column j's position, the column at a position
  std::size_t front_ = 0;                 // positions [0, front_) hold the nonbasic columns
  std::vector<char> is_basic_, at_upper_; // flags (not vector<bool>: read in the inner loops)
  std::size_t iterations_ = 0;
  std::size_t limit_ = 0;
  std::size_t since_refactor_ = 0;
};

} // namespace detail

namespace detail {

// The dual of a tall LP, solved with the primal simplex and mapped back.
//
// The primal is first written as  min c x  s.t.  A x (rel) b,  x >= 0  in shifted variables (the
// same shift/mirror/split as the simplex uses), with finite upper bounds as extra <= rows. Its dual
// is  max b y  s.t.  A^T y <= c,  y >= 0 on >= rows, y <= 0 on <= rows, y free on = rows: as many
// rows as the primal has columns. At the optimum the dual's row duals are the primal x, its
// variables are the primal row duals, and its row slacks are the primal reduced costs.
class dual_route {
public:
  dual_route(const problem& p, const options& opt) : p_(p), opt_(opt) { build(); }

  result run(const basis* warm) {
    options inner = opt_;
    inner.form = options::formulation::primal;
    std::optional<basis> dual_warm;
    if (warm != nullptr)
      dual_warm = to_dual_basis(*warm);
    const result d = solve_dual(inner, dual_warm ? &*dual_warm : nullptr);
    result r;
    r.solved_dual = true;
    r.revised = d.revised;
    r.iterations = d.iterations;
    r.phase1_iterations = d.phase1_iterations;
    r.warm_started = d.warm_started;
    switch (d.status) {
    case status::optimal:
      return answer(r, d);
    case status::unbounded:
      return fail(r, status::infeasible,
                  "the dual is unbounded: the problem has no feasible point");
    case status::infeasible: {
      // Infeasible dual: the primal is unbounded if it has a feasible point at all. With zero
      // costs the dual is feasible (y = 0) and is bounded exactly when the primal is feasible.
      problem zero = dual_;
      for (std::size_t k = 0; k < zero.row_count(); ++k)
        zero.set_rhs(k, 0.0);
      const result z = solve(zero, inner);
      r.iterations += z.iterations;
      if (z.status == status::optimal)
        return fail(r, status::unbounded, "the objective decreases without bound");
      if (z.status == status::unbounded)
        return fail(r, status::infeasible, "the problem has no feasible point");
      return fail(r, z.status, "deciding between infeasible and unbounded: " + z.message);
    }
    default:
      return fail(r, d.status, "solving the dual: " + d.message);
    }
  }

private:
  struct column {
    std::size_t var = 0;
    double sign = 1.0; // x_var = offset + sign * x_col
  };

  void build() {
    const auto& vars = p_.variables();
    const auto& rows = p_.rows();
    const double obj_sign = p_.sense() == sense::maximize ? -1.0 : 1.0;
    offset_.assign(vars.size(), 0.0);
    first_col_.assign(vars.size(), 0);
    for (std::size_t j = 0; j < vars.size(); ++j) {
      const auto& v = vars[j];
      first_col_[j] = cols_.size();
      if (std::isfinite(v.lower)) {
        offset_[j] = v.lower;
        cols_.push_back({j, 1.0});
      } else if (std::isfinite(v.upper)) {
        offset_[j] = v.upper;
        cols_.push_back({j, -1.0});
      } else {
        cols_.push_back({j, 1.0});
        cols_.push_back({j, -1.0});
      }
    }
    // Dual variables: one per primal row, then one per finite upper bound (a <= row x_col <= u-l).
    dual_ = problem(sense::maximize);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      double rhs = rows[i].rhs;
      for (const term& t : rows[i].terms)
        rhs -= t.coefficient * offset_[t.variable];
      const relation rel = rows[i].rel;
      dual_.add_variable(rows[i].name, rel == relation::greater_equal ? 0.0 : -inf,
                         rel == relation::less_equal ? 0.0 : inf, rhs);
    }
    for (std::size_t k = 0; k < cols_.size(); ++k) {
      const auto& v = vars[cols_[k].var];
      if (cols_[k].sign > 0.0 && std::isfinite(v.lower) && std::isfinite(v.upper)) {
        bound_var_.push_back(dual_.add_variable(v.name + "<=upper", -inf, 0.0, v.upper - v.lower));
        bound_col_.push_back(k);
      }
    }
    // Dual rows: one per primal column k:  sum_i a_ik y_i (+ w_k) <= c_k.
    std::vector<std::vector<term>> terms(cols_.size());
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (const term& t : rows[i].terms)
        for (std::size_t k = first_col_[t.variable]; k < cols_.size() && cols_[k].var == t.variable;
             ++k)
          terms[k].push_back({i, t.coefficient * cols_[k].sign});
    for (std::size_t b = 0; b < bound_col_.size(); ++b)
      terms[bound_col_[b]].push_back({bound_var_[b], 1.0});
    for (std::size_t k = 0; k < cols_.size(); ++k)
      dual_.add_row(vars[cols_[k].var].name, std::move(terms[k]), relation::less_equal,
                    obj_sign * vars[cols_[k].var].cost * cols_[k].sign);
  }

  result solve_dual(const options& inner, const basis* warm) const {
    return solve(dual_, inner, warm);
  }

  result answer(result& r, const result& d) const {
    const auto& vars = p_.variables();
    const auto& rows = p_.rows();
    const double obj_sign = p_.sense() == sense::maximize ? -1.0 : 1.0;
    r.x = offset_;
    r.reduced_costs.assign(vars.size(), 0.0);
    for (std::size_t k = 0; k < cols_.size(); ++k)
      r.x[cols_[k].var] += cols_[k].sign * std::max(0.0, d.duals[k]);
    // Reduced cost of a column = its dual row's slack (plus the upper bound's multiplier, which
    // the caller's variable carries itself); in the caller's sense and orientation.
    std::vector<double> slack(cols_.size());
    for (std::size_t k = 0; k < cols_.size(); ++k)
      slack[k] = dual_.rows()[k].rhs - d.row_activity[k];
    for (std::size_t b = 0; b < bound_col_.size(); ++b)
      slack[bound_col_[b]] += d.x[bound_var_[b]];
    for (std::size_t j = 0; j < vars.size(); ++j)
      r.reduced_costs[j] = obj_sign * cols_[first_col_[j]].sign * slack[first_col_[j]] + 0.0;
    r.duals.assign(rows.size(), 0.0);
    r.row_activity.assign(rows.size(), 0.0);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      r.duals[i] = obj_sign * d.x[i] + 0.0;
      for (const term& t : rows[i].terms)
        r.row_activity[i] += t.coefficient * r.x[t.variable];
    }
    r.objective = 0.0;
    for (std::size_t j = 0; j < vars.size(); ++j)
      r.objective += vars[j].cost * r.x[j];
    r.final_basis = from_dual_basis(d.final_basis, r.x);
    r.status = status::optimal;
    return std::move(r); // r is the caller's, done with
  }

  result& fail(result& r, status s, std::string message) const {
    r.status = s;
    r.message = std::move(message);
    r.x = offset_;
    for (double& v : r.x)
      if (!std::isfinite(v))
        v = 0.0;
    r.duals.assign(p_.row_count(), 0.0);
    r.row_activity.assign(p_.row_count(), 0.0);
    r.reduced_costs.assign(p_.variable_count(), 0.0);
    return r;
  }

  // Complementary bases: a primal row is basic (inactive) exactly when its dual variable is
  // nonbasic, and a primal column is basic exactly when its dual row is.
  basis from_dual_basis(const basis& d, const std::vector<double>& x) const {
    const auto& vars = p_.variables();
    const auto& rows = p_.rows();
    basis b;
    b.variables.assign(vars.size(), basis_status::at_lower);
    for (std::size_t j = 0; j < vars.size(); ++j) {
      const auto& v = vars[j];
      bool basic = false;
      for (std::size_t k = first_col_[j]; k < cols_.size() && cols_[k].var == j; ++k)
        basic = basic || d.rows[k] == basis_status::basic;
      const double tol = opt_.feasibility_tolerance * std::max(1.0, std::abs(x[j]));
      b.variables[j] = basic                                             ? basis_status::basic
                       : v.lower == v.upper                              ? basis_status::fixed
                       : std::isfinite(v.upper) && x[j] >= v.upper - tol ? basis_status::at_upper
                       : std::isfinite(v.lower)                          ? basis_status::at_lower
                       : std::isfinite(v.upper)                          ? basis_status::at_upper
                                                                         : basis_status::free_zero;
    }
    b.rows.assign(rows.size(), basis_status::basic);
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (d.variables[i] == basis_status::basic)
        b.rows[i] = rows[i].rel == relation::less_equal      ? basis_status::at_upper
                    : rows[i].rel == relation::greater_equal ? basis_status::at_lower
                                                             : basis_status::fixed;
    return b;
  }

  std::optional<basis> to_dual_basis(const basis& w) const {
    const auto& vars = p_.variables();
    const auto& rows = p_.rows();
    if (w.variables.size() != vars.size() || w.rows.size() != rows.size())
      return std::nullopt;
    basis d;
    d.variables.assign(dual_.variable_count(), basis_status::basic);
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (w.rows[i] == basis_status::basic) // inactive row: its dual sits at zero
        d.variables[i] = rows[i].rel == relation::less_equal      ? basis_status::at_upper
                         : rows[i].rel == relation::greater_equal ? basis_status::at_lower
                                                                  : basis_status::free_zero;
    for (std::size_t b = 0; b < bound_col_.size(); ++b)
      if (w.variables[cols_[bound_col_[b]].var] != basis_status::at_upper)
        d.variables[bound_var_[b]] = basis_status::at_upper; // bound inactive: w = 0
    d.rows.assign(cols_.size(), basis_status::at_upper);
    for (std::size_t j = 0; j < vars.size(); ++j)
      if (w.variables[j] == basis_status::basic)
        d.rows[first_col_[j]] = basis_status::basic;
    return d;
  }

  const problem& p_;
  const options& opt_;
  problem dual_;
  std::vector<column> cols_;
  std::vector<std::size_t> first_col_;
  std::vector<double> offset_;
  std::vector<std::size_t> bound_var_, bound_col_;
};

[[nodiscard]] inline bool is_tall(const problem& p) {
  std::size_t columns = 0;
  for (const auto& v : p.variables())
    columns += std::isfinite(v.lower) || std::isfinite(v.upper) ? 1U : 2U;
  return p.row_count() > 40 && p.row_count() > 2 * columns;
}

} // namespace detail

/// Solves `p`. Returns the status with the answer; throws only for invalid options. `warm` is a
/// basis from an earlier solve of the same variables and rows (costs, coefficients, bounds and
/// right-hand sides may differ): when it is feasible, phase 1 is skipped; when it is not, phase 1
/// starts from it with a single artificial variable (see try_warm_start).
[[nodiscard]] inline result solve(const problem& p, const options& opt, const basis* warm) {
  const bool dual = opt.form == options::formulation::dual ||
                    (opt.form == options::formulation::automatic && detail::is_tall(p));
  if (dual)
    return detail::dual_route(p, opt).run(warm);
  if (opt.algorithm == options::method::revised ||
      (opt.algorithm == options::method::automatic &&
       p.row_count() * (p.row_count() + p.variable_count()) > opt.revised_threshold))
    return detail::revised_simplex(p, opt).run(warm);
  detail::dense_simplex s(p, opt);
  return s.run(warm);
}

} // namespace hspmd::lp
