#pragma once
// The revised two-phase primal simplex with bounded variables, for LPs where the dense tableau's
// rows x columns per pivot is the cost.
//
// It runs the same standard form, phases, pricing (Dantzig, Bland after a run of degenerate
// pivots), ratio test, bound flips, warm starts and answer as the dense tableau (simplex.hpp), but
// never forms B^-1 A. Each iteration computes the duals y = c_B B^-1 (BTRAN), prices every
// nonbasic column from the sparse A (work in A's nonzeros), and solves for the entering column
// alone (FTRAN). B is held as an LU factorization chosen for sparsity (Markowitz: singleton
// columns and rows first, then the sparsest column's row of fewest entries among those within a
// threshold of its largest), and each basis change appends a sparse eta (product form); the basis
// is factorized afresh from the data every `refactor_interval` changes and before the answer is
// read. On the ratio LP's dual (a column per (step, device) row of the primal, two or three
// nonzeros each) the factors stay about as sparse as B, so an iteration costs a few times the
// nonzeros of A instead of rows x columns.

#include <hspmd/lp/problem.hpp>
#include <hspmd/lp/standard_form.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::lp::detail {

/// LU factors of an m x m basis with product-form updates.
///
/// Elimination step k pivots on row p_k and basis position q_k: every other active row i with an
/// entry in column q_k subtracts l_ik times row p_k (the L part, kept per step); row p_k's entries
/// in columns not yet pivoted are U's row k. FTRAN applies L, back-substitutes U, then the etas;
/// BTRAN does the transposes in reverse.
class sparse_lu {
public:
  /// Factorizes the matrix whose column k holds the entries `columns(k, add)` passes to
  /// add(row, value). Returns false when it is singular (no acceptable pivot for some column).
  template <class Columns>
  bool factor(std::size_t m, Columns&& columns) {
    m_ = m;
    w_.assign(m * m, 0.0);
    row_count_.assign(m, 0);
    col_count_.assign(m, 0);
    row_done_.assign(m, false);
    col_done_.assign(m, false);
    for (std::size_t k = 0; k < m; ++k)
      columns(k, [&](std::size_t i, double v) {
        if (v == 0.0)
          return;
        if (w_[i * m + k] == 0.0) {
          ++row_count_[i];
          ++col_count_[k];
        }
        w_[i * m + k] += v;
      });
    pivot_row_.clear();
    pivot_col_.clear();
    pivot_value_.clear();
    l_start_.assign(1, 0);
    l_index_.clear();
    l_value_.clear();
    u_start_.assign(1, 0);
    u_index_.clear();
    u_value_.clear();
    etas_.clear();
    eta_index_.clear();
    eta_value_.clear();
    std::vector<std::size_t> row_cols;
    for (std::size_t step = 0; step < m; ++step) {
      const auto [p, q] = choose_pivot();
      if (p == none)
        return false;
      const double piv = w_[p * m + q];
      row_cols.clear();
      for (std::size_t j = 0; j < m; ++j)
        if (!col_done_[j] && j != q && w_[p * m + j] != 0.0)
          row_cols.push_back(j);
      for (std::size_t i = 0; i < m; ++i) {
        if (row_done_[i] || i == p)
          continue;
        double& wiq = w_[i * m + q];
        if (wiq == 0.0)
          continue;
        const double l = wiq / piv;
        wiq = 0.0;
        --row_count_[i];
        l_index_.push_back(i);
        l_value_.push_back(l);
        double* wi = &w_[i * m];
        const double* wp = &w_[p * m];
        for (std::size_t j : row_cols) {
          if (wi[j] == 0.0) {
            ++row_count_[i];
            ++col_count_[j];
          }
          wi[j] -= l * wp[j];
        }
      }
      l_start_.push_back(l_index_.size());
      for (std::size_t j : row_cols) {
        u_index_.push_back(j);
        u_value_.push_back(w_[p * m + j]);
        --col_count_[j];
      }
      u_start_.push_back(u_index_.size());
      pivot_row_.push_back(p);
      pivot_col_.push_back(q);
      pivot_value_.push_back(piv);
      row_done_[p] = true;
      col_done_[q] = true;
    }
    return true;
  }

  /// Solves B x = a: `a` by row in, x by basis position out (`a` is used as work space).
  void ftran(std::vector<double>& a, std::vector<double>& x) const {
    x.assign(m_, 0.0);
    for (std::size_t k = 0; k < m_; ++k)
      if (const double v = a[pivot_row_[k]]; v != 0.0)
        for (std::size_t e = l_start_[k]; e < l_start_[k + 1]; ++e)
          a[l_index_[e]] -= l_value_[e] * v;
    for (std::size_t k = m_; k-- > 0;) {
      double s = a[pivot_row_[k]];
      for (std::size_t e = u_start_[k]; e < u_start_[k + 1]; ++e)
        s -= u_value_[e] * x[u_index_[e]];
      x[pivot_col_[k]] = s / pivot_value_[k];
    }
    for (const eta& t : etas_) {
      const double xr = x[t.position] / t.pivot;
      x[t.position] = xr;
      if (xr != 0.0)
        for (std::size_t e = t.first; e < t.last; ++e)
          x[eta_index_[e]] -= eta_value_[e] * xr;
    }
  }

  /// Solves y B = c: `c` by basis position in (used as work space), y by row out.
  void btran(std::vector<double>& c, std::vector<double>& y) const {
    for (std::size_t t = etas_.size(); t-- > 0;) {
      const eta& et = etas_[t];
      double s = c[et.position];
      for (std::size_t e = et.first; e < et.last; ++e)
        s -= eta_value_[e] * c[eta_index_[e]];
      c[et.position] = s / et.pivot;
    }
    y.assign(m_, 0.0);
    for (std::size_t k = 0; k < m_; ++k) {
      const double z = c[pivot_col_[k]] / pivot_value_[k];
      y[pivot_row_[k]] = z;
      if (z != 0.0)
        for (std::size_t e = u_start_[k]; e < u_start_[k + 1]; ++e)
          c[u_index_[e]] -= z * u_value_[e];
    }
    for (std::size_t k = m_; k-- > 0;) {
      double s = 0.0;
      for (std::size_t e = l_start_[k]; e < l_start_[k + 1]; ++e)
        s += l_value_[e] * y[l_index_[e]];
      y[pivot_row_[k]] -= s;
    }
  }

  /// Records that basis position r now holds the column whose FTRAN is `alpha`.
  void update(std::size_t r, const std::vector<double>& alpha) {
    eta t{r, alpha[r], eta_index_.size(), 0};
    for (std::size_t i = 0; i < m_; ++i)
      if (i != r && alpha[i] != 0.0) {
        eta_index_.push_back(i);
        eta_value_.push_back(alpha[i]);
      }
    t.last = eta_index_.size();
    etas_.push_back(t);
  }

  [[nodiscard]] std::size_t updates() const noexcept { return etas_.size(); }
  /// Nonzeros in L, U and the etas: what one FTRAN or BTRAN touches.
  [[nodiscard]] std::size_t nonzeros() const noexcept {
    return l_index_.size() + u_index_.size() + eta_index_.size();
  }

private:
  struct eta {
    std::size_t position;
    double pivot;
    std::size_t first, last;
  };

  // Markowitz pivot choice on the active submatrix. A column singleton needs no multipliers; a
  // row singleton is taken when its entry passes the threshold in its column; otherwise the
  // active column of fewest entries, and in it the row of fewest entries among those within
  // `threshold` of the column's largest entry (ties to the larger entry, then the lower row).
  std::pair<std::size_t, std::size_t> choose_pivot() const {
    constexpr double threshold = 0.1;
    std::size_t best_col = none;
    std::size_t best_row = none;
    for (std::size_t j = 0; j < m_; ++j)
      if (!col_done_[j] && (best_col == none || col_count_[j] < col_count_[best_col]))
        best_col = j;
    for (std::size_t i = 0; i < m_; ++i)
      if (!row_done_[i] && (best_row == none || row_count_[i] < row_count_[best_row]))
        best_row = i;
    if (best_col == none)
      return {none, none};
    const auto column_max = [&](std::size_t j) {
      double big = 0.0;
      for (std::size_t i = 0; i < m_; ++i)
        if (!row_done_[i])
          big = std::max(big, std::abs(w_[i * m_ + j]));
      return big;
    };
    if (col_count_[best_col] > 1 && best_row != none && row_count_[best_row] == 1) {
      for (std::size_t j = 0; j < m_; ++j)
        if (!col_done_[j] && w_[best_row * m_ + j] != 0.0) {
          if (std::abs(w_[best_row * m_ + j]) >= threshold * column_max(j))
            return {best_row, j};
          break;
        }
    }
    const double big = column_max(best_col);
    if (!(big > 1e-11))
      return {none, none};
    std::size_t p = none;
    for (std::size_t i = 0; i < m_; ++i) {
      if (row_done_[i])
        continue;
      const double v = std::abs(w_[i * m_ + best_col]);
      if (v < threshold * big || v == 0.0)
        continue;
      if (p == none || row_count_[i] < row_count_[p] ||
          (row_count_[i] == row_count_[p] && v > std::abs(w_[p * m_ + best_col])))
        p = i;
    }
    return {p, best_col};
  }

  std::size_t m_ = 0;
  std::vector<double> w_; // the active submatrix, dense by rows, during factor()
  std::vector<std::size_t> row_count_, col_count_;
  std::vector<char> row_done_, col_done_;
  std::vector<std::size_t> pivot_row_, pivot_col_;
  std::vector<double> pivot_value_;
  std::vector<std::size_t> l_start_, l_index_, u_start_, u_index_;
  std::vector<double> l_value_, u_value_;
  std::vector<eta> etas_;
  std::vector<std::size_t> eta_index_;
  std::vector<double> eta_value_;
};

class revised_simplex {
public:
  revised_simplex(const problem& p, const options& opt) : p_(p), opt_(opt), sf_(p, opt) {
    m_ = sf_.m;
    n_ = sf_.n;
    warm_col_ = n_ + m_;
    width_ = n_ + m_ + 1;
    cost_ = sf_.cost;
    cost_.resize(width_, 0.0);
    upper_ = sf_.upper;
    upper_.resize(width_, inf);
    upper_[warm_col_] = 0.0;
  }

  result run(const basis* warm) {
    result res;
    res.revised = true;
    limit_ = opt_.iteration_limit != 0 ? opt_.iteration_limit : 50 * (m_ + n_) + 1000;
    const warm_outcome w = warm != nullptr ? try_warm_start(*warm) : warm_outcome::rejected;
    if (w == warm_outcome::rejected && !cold_start())
      return finish(res, status::numerical_trouble, "the starting basis is singular");
    res.warm_started = w != warm_outcome::rejected;
    if (w != warm_outcome::feasible) {
      const lp::status s1 = phase(phase1_costs_);
      res.phase1_iterations = iterations_;
      if (s1 == status::iteration_limit)
        return finish(res, status::iteration_limit, "iteration limit reached in phase 1");
      if (s1 == status::numerical_trouble)
        return finish(res, s1, "the basis became singular in phase 1");
      if (phase1_infeasibility() > sf_.feasibility_scale(opt_))
        return finish(res, status::infeasible,
                      "phase 1 ended with artificial variables summing to " +
                          std::to_string(phase1_infeasibility()));
      if (!drive_out_artificials())
        return finish(res, status::numerical_trouble, "the basis became singular in phase 1");
    }
    lp::status s2 = phase(cost_);
    // Factorize afresh from the original data and confirm; a drifted solve gets more tries.
    for (int attempt = 0; s2 == status::optimal && attempt < 3; ++attempt) {
      if (!refactor())
        return finish(res, status::numerical_trouble, "the optimal basis is singular");
      price(cost_);
      if (primal_feasible() && entering(false) == none)
        break;
      s2 = phase(cost_);
    }
    if (s2 == status::unbounded)
      return finish(res, status::unbounded, "the objective decreases without bound");
    if (s2 != status::optimal)
      return finish(res, s2,
                    s2 == status::iteration_limit ? "iteration limit reached in phase 2"
                                                  : "numerical trouble in phase 2");
    return finish(res, status::optimal, {});
  }

  static constexpr std::size_t refactor_interval = 100;

private:
  // ---- columns ---------------------------------------------------------------------------------
  template <class F>
  void for_each_entry(std::size_t col, F&& f) const {
    if (col < n_) {
      for (std::size_t e = sf_.start[col]; e < sf_.start[col + 1]; ++e)
        f(sf_.index[e], sf_.value[e]);
    } else if (col < n_ + m_) {
      f(col - n_, 1.0);
    } else {
      for (std::size_t i = 0; i < warm_column_.size(); ++i)
        if (warm_column_[i] != 0.0)
          f(i, warm_column_[i]);
    }
  }
  [[nodiscard]] double dot(std::size_t col, const std::vector<double>& y) const {
    double s = 0.0;
    for_each_entry(col, [&](std::size_t i, double v) { s += v * y[i]; });
    return s;
  }
  [[nodiscard]] bool is_artificial(std::size_t j) const noexcept { return j >= n_; }

  // ---- linear algebra --------------------------------------------------------------------------
  // Factorizes the basis from the data and recomputes the basic values.
  bool refactor() {
    if (!lu_.factor(m_, [&](std::size_t k, auto&& add) { for_each_entry(basic_[k], add); }))
      return false;
    work_ = sf_.b;
    for (std::size_t j = 0; j < width_; ++j)
      if (!is_basic_[j] && at_upper_[j])
        for_each_entry(j, [&](std::size_t i, double v) { work_[i] -= v * upper_[j]; });
    lu_.ftran(work_, beta_);
    return true;
  }
  // alpha = B^-1 a_col (by basis position).
  void column(std::size_t col) {
    work_.assign(m_, 0.0);
    for_each_entry(col, [&](std::size_t i, double v) { work_[i] = v; });
    lu_.ftran(work_, alpha_);
  }
  // The duals of `costs`.
  void duals(const std::vector<double>& costs) {
    work_.resize(m_);
    for (std::size_t k = 0; k < m_; ++k)
      work_[k] = costs[basic_[k]];
    lu_.btran(work_, y_);
    if (d_.size() != width_)
      d_.assign(width_, 0.0);
  }
  // The duals of `costs` and every column's reduced cost (artificials never enter: theirs stay 0).
  void price(const std::vector<double>& costs) {
    duals(costs);
    for (std::size_t j = 0; j < n_; ++j)
      d_[j] = is_basic_[j] ? 0.0 : costs[j] - dot(j, y_);
  }
  // The entering column. Partial pricing: the columns are priced a section at a time, starting
  // where the last search stopped, and the best improving column of the first section that has
  // one enters (Dantzig within the section); `none` only after every column was priced with the
  // current duals and none improves. Bland's rule prices in index order and takes the first.
  std::size_t select(const std::vector<double>& costs, bool bland) {
    duals(costs);
    const std::size_t section = std::max<std::size_t>(section_min, n_ / sections);
    const std::size_t from = bland ? 0 : cursor_;
    for (std::size_t done = 0; done < n_;) {
      const std::size_t begin = (from + done) % n_;
      const std::size_t end = std::min(n_, begin + section);
      std::size_t enter = none;
      double best = 0.0;
      for (std::size_t j = begin; j < end; ++j) {
        if (is_basic_[j] || upper_[j] == 0.0)
          continue;
        d_[j] = costs[j] - dot(j, y_);
        if (!improving(j))
          continue;
        if (bland)
          return j;
        if (std::abs(d_[j]) > best) {
          best = std::abs(d_[j]);
          enter = j;
        }
      }
      done += end - begin;
      if (enter != none) {
        cursor_ = end % n_;
        return enter;
      }
    }
    return none;
  }
  static constexpr std::size_t sections = 16;
  static constexpr std::size_t section_min = 256;

  // ---- starting bases ---------------------------------------------------------------------------
  bool cold_start() {
    basic_.assign(m_, none);
    is_basic_.assign(width_, false);
    at_upper_.assign(width_, false);
    for (std::size_t i = 0; i < m_; ++i) {
      basic_[i] = sf_.unit_slack(i) ? sf_.slack[i] : n_ + i;
      is_basic_[basic_[i]] = true;
    }
    for (std::size_t i = 0; i < m_; ++i)
      upper_[n_ + i] = basic_[i] == n_ + i ? inf : 0.0; // unused artificials stay at zero
    phase1_costs_.assign(width_, 0.0);
    for (std::size_t i = 0; i < m_; ++i)
      phase1_costs_[n_ + i] = 1.0;
    return refactor();
  }

  enum class warm_outcome : unsigned char { rejected, feasible, needs_phase1 };

  // As the dense simplex's: a feasible basis goes straight to phase 2; an infeasible one gets one
  // artificial column q = -B w (w: how far each basic variable is outside its bounds) at value 1.
  warm_outcome try_warm_start(const basis& w) {
    const auto& vars = p_.variables();
    if (w.variables.size() != vars.size() || w.rows.size() != m_)
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
        if (vm.k == var_kind::shifted && std::isfinite(upper_[vm.col]))
          at_upper_[vm.col] = true;
        else if (vm.k != var_kind::mirrored)
          return warm_outcome::rejected;
      } else if ((s == basis_status::at_lower && vm.k != var_kind::shifted) ||
                 (s == basis_status::free_zero && vm.k != var_kind::split)) {
        return warm_outcome::rejected;
      }
    }
    for (std::size_t i = 0; i < m_; ++i)
      if (w.rows[i] == basis_status::basic)
        basic_.push_back(sf_.slack[i] != none ? sf_.slack[i] : n_ + i);
    if (basic_.size() != m_)
      return warm_outcome::rejected;
    for (std::size_t c : basic_)
      is_basic_[c] = true;
    for (std::size_t i = 0; i < m_; ++i)
      upper_[n_ + i] = 0.0;
    phase1_costs_.assign(width_, 0.0);
    if (!refactor())
      return warm_outcome::rejected;
    if (primal_feasible())
      return warm_outcome::feasible;
    const double tol = sf_.feasibility_scale(opt_);
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
    warm_column_.assign(m_, 0.0);
    for (std::size_t k = 0; k < m_; ++k)
      if (shift[k] != 0.0)
        for_each_entry(basic_[k],
                       [&](std::size_t i, double v) { warm_column_[i] -= v * shift[k]; });
    upper_[warm_col_] = inf;
    phase1_costs_[warm_col_] = 1.0;
    alpha_.assign(m_, 0.0);
    for (std::size_t i = 0; i < m_; ++i)
      alpha_[i] = -shift[i];
    for (std::size_t i = 0; i < m_; ++i)
      beta_[i] += shift[i]; // the artificial at 1 moves every infeasible variable to its bound
    exchange(worst, warm_col_, shift[worst] < 0.0);
    beta_[worst] = 1.0;
    return warm_outcome::needs_phase1;
  }

  // ---- tests -----------------------------------------------------------------------------------
  [[nodiscard]] bool primal_feasible() const {
    return within_bounds(beta_, basic_, upper_, sf_.feasibility_scale(opt_));
  }
  [[nodiscard]] bool improving(std::size_t j) const {
    if (upper_[j] == 0.0)
      return false; // fixed at zero
    return at_upper_[j] ? d_[j] > opt_.optimality_tolerance : d_[j] < -opt_.optimality_tolerance;
  }
  // The entering column: Dantzig (largest |d|) or Bland (lowest index); `none` at the optimum.
  [[nodiscard]] std::size_t entering(bool bland) const {
    std::size_t enter = none;
    double best = 0.0;
    for (std::size_t j = 0; j < n_; ++j) {
      if (is_basic_[j] || !improving(j))
        continue;
      if (bland)
        return j;
      if (std::abs(d_[j]) > best) {
        best = std::abs(d_[j]);
        enter = j;
      }
    }
    return enter;
  }
  [[nodiscard]] double phase1_infeasibility() const {
    double w = 0.0;
    for (std::size_t i = 0; i < m_; ++i)
      if (is_artificial(basic_[i]))
        w += std::max(0.0, beta_[i]);
    return w;
  }

  // ---- iterations ------------------------------------------------------------------------------
  lp::status phase(const std::vector<double>& costs) {
    std::size_t degenerate = 0;
    while (true) {
      if (iterations_ >= limit_)
        return status::iteration_limit;
      const std::size_t enter = select(costs, degenerate >= opt_.degenerate_run);
      if (enter == none)
        return status::optimal;
      const double dir = at_upper_[enter] ? -1.0 : 1.0;
      column(enter);

      const auto [theta, leave, leave_at_upper] =
          ratio_test([&](std::size_t i) { return alpha_[i]; }, dir, upper_[enter], beta_, basic_,
                     upper_, opt_.pivot_tolerance);
      if (!std::isfinite(theta))
        return status::unbounded;
      ++iterations_;
      degenerate = theta <= 1e-12 ? degenerate + 1 : 0;
      for (std::size_t i = 0; i < m_; ++i)
        beta_[i] -= theta * dir * alpha_[i];
      if (leave == none) { // bound flip: no basis change
        at_upper_[enter] = !at_upper_[enter];
        continue;
      }
      const double entering_value = dir > 0.0 ? theta : upper_[enter] - theta;
      exchange(leave, enter, leave_at_upper);
      beta_[leave] = entering_value;
      if (lu_.updates() >= refactor_interval && !refactor())
        return status::numerical_trouble;
    }
  }

  // Column `enter` (whose FTRAN is in alpha_) takes basis position r; the leaving variable
  // becomes nonbasic at its upper bound when `leaves_at_upper`, else at zero.
  void exchange(std::size_t r, std::size_t enter, bool leaves_at_upper) {
    const std::size_t leaving = basic_[r];
    lu_.update(r, alpha_);
    is_basic_[leaving] = false;
    at_upper_[leaving] = leaves_at_upper;
    is_basic_[enter] = true;
    at_upper_[enter] = false;
    basic_[r] = enter;
  }

  // Artificials still basic (at zero) leave for a structural or slack column where their row of
  // B^-1 A has an entry; a row without one is redundant and keeps its artificial fixed at zero.
  bool drive_out_artificials() {
    for (std::size_t r = 0; r < m_; ++r) {
      if (!is_artificial(basic_[r]))
        continue;
      work_.assign(m_, 0.0);
      work_[r] = 1.0;
      std::vector<double> rho;
      lu_.btran(work_, rho);
      std::size_t best = none;
      double big = 1e-7;
      for (std::size_t j = 0; j < n_; ++j) {
        if (is_basic_[j])
          continue;
        if (const double a = std::abs(dot(j, rho)); a > big) {
          big = a;
          best = j;
        }
      }
      if (best == none)
        continue;
      column(best);
      exchange(r, best, false);
    }
    for (std::size_t i = 0; i < m_; ++i)
      upper_[n_ + i] = 0.0;
    upper_[warm_col_] = 0.0;
    return refactor(); // the entering columns kept their bound values: recompute the basic ones
  }

  // ---- answer ----------------------------------------------------------------------------------
  result finish(result& res, lp::status s, std::string message) { // moves res out
    if (basic_.size() != m_ || lu_.updates() > 0 || d_.size() != width_) {
      if (basic_.size() == m_ && refactor())
        price(cost_);
      else
        d_.assign(width_, 0.0);
    }
    if (y_.size() != m_)
      y_.assign(m_, 0.0);
    std::vector<double> v(width_, 0.0);
    for (std::size_t j = 0; j < width_; ++j)
      if (!is_basic_.empty() && !is_basic_[j] && at_upper_[j])
        v[j] = upper_[j];
    for (std::size_t i = 0; i < basic_.size() && i < beta_.size(); ++i)
      v[basic_[i]] = beta_[i];
    if (is_basic_.size() != width_) {
      is_basic_.assign(width_, false);
      at_upper_.assign(width_, false);
    }
    res.iterations = iterations_;
    return std::move(
        answer(res, p_, opt_, sf_, {v, d_, is_basic_, at_upper_, y_}, s, std::move(message)));
  }

  const problem& p_;
  const options& opt_;
  standard_form sf_;
  std::size_t m_ = 0, n_ = 0, width_ = 0, warm_col_ = 0;
  std::vector<double> cost_, upper_, phase1_costs_, warm_column_;
  std::vector<std::size_t> basic_;
  std::vector<char> is_basic_, at_upper_; // flags (not vector<bool>: read in the inner loops)
  std::vector<double> beta_, alpha_, y_, d_, work_;
  sparse_lu lu_;
  std::size_t cursor_ = 0; // where partial pricing goes on
  std::size_t iterations_ = 0;
  std::size_t limit_ = 0;
};

} // namespace hspmd::lp::detail
