#pragma once
// The standard form both simplex implementations run on, and the mapping of their answer back.
//
//   min c x  s.t.  A x = b (b >= 0), 0 <= x <= u
//
// A variable with a finite lower bound is shifted (x = l + x'), one with only an upper bound is
// mirrored (x = u - x'), a free one is split (x = x+ - x-); a <= row gets a slack (+1), a >= row a
// surplus (-1), and rows with a negative right-hand side are negated. Rows and columns are then
// scaled by powers of two (geometric means, then each column's largest entry to 1; the objective's
// largest coefficient to 1) so that tolerances mean the same on every problem and the scaled data
// stay exactly representable from the original. A is kept by columns (sparse): the dense tableau
// expands it, the revised simplex uses it as it is.

#include <hspmd/lp/problem.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::lp {

/// Outcome of a solve.
enum class status : unsigned char {
  optimal,
  infeasible,
  unbounded,
  iteration_limit,
  numerical_trouble
};

[[nodiscard]] constexpr std::string_view name(status s) noexcept {
  switch (s) {
  case status::optimal:
    return "optimal";
  case status::infeasible:
    return "infeasible";
  case status::unbounded:
    return "unbounded";
  case status::iteration_limit:
    return "iteration_limit";
  case status::numerical_trouble:
    break;
  }
  return "numerical_trouble";
}

/// Where a variable or a row's activity sits in a basis (GLPK's convention for rows: a <= row
/// that binds is `at_upper`, a >= row that binds `at_lower`, an equality row `fixed`).
enum class basis_status : unsigned char { basic, at_lower, at_upper, free_zero, fixed };

/// A basis: one status per variable and per row. Feed it back to `solve` to warm-start.
struct basis {
  std::vector<basis_status> variables;
  std::vector<basis_status> rows;
  friend bool operator==(const basis&, const basis&) = default;
};

/// Tolerances and limits. Tolerances apply to the scaled problem.
struct options {
  double pivot_tolerance = 1e-9;       ///< smallest |entry| accepted as a pivot
  double feasibility_tolerance = 1e-7; ///< primal infeasibility accepted
  double optimality_tolerance = 1e-7;  ///< reduced cost accepted as non-improving
  std::size_t iteration_limit = 0;     ///< pivots + bound flips; 0: 50 * (rows + columns) + 1000
  std::size_t degenerate_run = 20;     ///< degenerate pivots in a row before Bland's rule
  bool scale = true;                   ///< scale rows and columns
  /// Which LP the simplex runs on. `automatic` solves the dual when the problem is tall (rows
  /// more than twice the columns, and more than 40 of them): the dual of a tall LP is wide and
  /// short, and every simplex step's cost grows with the row count.
  enum class formulation : unsigned char { automatic, primal, dual } form = formulation::automatic;
  /// Which implementation runs. `dense`: the tableau B^-1 A, updated in place (rows x columns per
  /// pivot; fastest on small problems). `revised`: B^-1 kept as a sparse LU factorization with
  /// product-form updates, columns priced from the sparse A (work per pivot in the nonzeros).
  /// `automatic` takes the revised one when the (formulated) problem has rows x columns above
  /// `revised_threshold`.
  enum class method : unsigned char { automatic, dense, revised } algorithm = method::automatic;
  std::size_t revised_threshold = 40000; ///< rows x columns from which `automatic` goes revised
};

/// What `solve` found. For statuses other than optimal, `x` holds the last point the simplex
/// visited (feasible for the original problem only when the status is iteration_limit after
/// phase 1) and `message` says what happened.
struct result {
  lp::status status = lp::status::numerical_trouble;
  double objective = 0.0;            ///< in the problem's own sense
  std::vector<double> x;             ///< one value per variable
  std::vector<double> row_activity;  ///< a . x per row
  std::vector<double> duals;         ///< per row: d objective / d rhs (shadow price)
  std::vector<double> reduced_costs; ///< per variable: d objective / d x at the bound it sits on
  std::size_t iterations = 0;        ///< pivots and bound flips, both phases
  std::size_t phase1_iterations = 0; ///< of which in phase 1
  lp::basis final_basis;             ///< feed back to `solve` to warm-start
  bool warm_started = false;         ///< the given basis was used (it was valid and feasible)
  bool solved_dual = false;          ///< the simplex ran on the dual LP (see options::form)
  bool revised = false;              ///< the revised simplex ran (see options::algorithm)
  std::string message;               ///< human-readable account of a non-optimal status
};

namespace detail {

inline constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

enum class var_kind : unsigned char { shifted, mirrored, split };
struct var_map {
  var_kind k = var_kind::shifted;
  std::size_t col = 0;  // std column (x' or x+)
  std::size_t col2 = 0; // x- for split
  double offset = 0.0;  // l for shifted, u for mirrored
};

/// The scaled standard form of a problem, with the maps back to it.
struct standard_form {
  std::size_t m = 0; ///< rows
  std::size_t n = 0; ///< structural + slack columns (artificials are the implementations')
  std::vector<var_map> vars;
  std::vector<std::size_t> slack;  ///< per row: its slack column, `none` for equality rows
  std::vector<std::size_t> start;  ///< column j's entries are [start[j], start[j + 1])
  std::vector<std::size_t> index;  ///< their rows, increasing within a column
  std::vector<double> value;       ///< their values
  std::vector<double> b, flip;     ///< per row: right-hand side (>= 0), -1 where negated
  std::vector<double> cost, upper; ///< per column
  std::vector<double> row_scale, col_scale;
  double cost_scale = 1.0;

  standard_form(const problem& p, const options& opt) {
    const auto& vs = p.variables();
    const auto& rows = p.rows();
    m = rows.size();
    std::size_t cols = 0;
    vars.resize(vs.size());
    for (std::size_t j = 0; j < vs.size(); ++j) {
      var_map& vm = vars[j];
      vm.col = cols++;
      if (std::isfinite(vs[j].lower)) {
        vm.k = var_kind::shifted;
        vm.offset = vs[j].lower;
      } else if (std::isfinite(vs[j].upper)) {
        vm.k = var_kind::mirrored;
        vm.offset = vs[j].upper;
      } else {
        vm.k = var_kind::split;
        vm.col2 = cols++;
      }
    }
    slack.assign(m, none);
    for (std::size_t i = 0; i < m; ++i)
      if (rows[i].rel != relation::equal)
        slack[i] = cols++;
    n = cols;
    cost.assign(n, 0.0);
    upper.assign(n, inf);
    const double obj_sign = p.sense() == sense::maximize ? -1.0 : 1.0;
    for (std::size_t j = 0; j < vs.size(); ++j) {
      const var_map& vm = vars[j];
      switch (vm.k) {
      case var_kind::shifted:
        cost[vm.col] = obj_sign * vs[j].cost;
        upper[vm.col] = vs[j].upper - vs[j].lower;
        break;
      case var_kind::mirrored:
        cost[vm.col] = -obj_sign * vs[j].cost;
        break;
      case var_kind::split:
        cost[vm.col] = obj_sign * vs[j].cost;
        cost[vm.col2] = -obj_sign * vs[j].cost;
        break;
      }
    }
    // Right-hand sides and signs row by row, then the entries straight into their columns
    // (counted first; rows in order, so each column's rows increase).
    b.assign(m, 0.0);
    flip.assign(m, 1.0);
    start.assign(n + 1, 0);
    for (std::size_t i = 0; i < m; ++i) {
      double rhs = rows[i].rhs;
      for (const term& t : rows[i].terms) {
        const var_map& vm = vars[t.variable];
        if (vm.k != var_kind::split)
          rhs -= t.coefficient * vm.offset;
        ++start[vm.col + 1];
        if (vm.k == var_kind::split)
          ++start[vm.col2 + 1];
      }
      if (slack[i] != none)
        ++start[slack[i] + 1];
      flip[i] = rhs < 0.0 ? -1.0 : 1.0;
      b[i] = std::abs(rhs);
    }
    for (std::size_t j = 0; j < n; ++j)
      start[j + 1] += start[j];
    index.resize(start[n]);
    value.resize(start[n]);
    std::vector<std::size_t> next(start.begin(), start.end() - 1);
    const auto put = [&](std::size_t i, std::size_t col, double v) {
      index[next[col]] = i;
      value[next[col]++] = flip[i] * v;
    };
    for (std::size_t i = 0; i < m; ++i) {
      for (const term& t : rows[i].terms) {
        const var_map& vm = vars[t.variable];
        put(i, vm.col, vm.k == var_kind::mirrored ? -t.coefficient : t.coefficient);
        if (vm.k == var_kind::split)
          put(i, vm.col2, -t.coefficient);
      }
      if (slack[i] != none)
        put(i, slack[i], rows[i].rel == relation::less_equal ? 1.0 : -1.0);
    }
    row_scale.assign(m, 1.0);
    col_scale.assign(n, 1.0);
    if (opt.scale)
      scale(rows);
  }

  /// Whether row i's slack is a unit column (+1 after negation and scaling).
  [[nodiscard]] bool unit_slack(std::size_t i) const {
    const std::size_t s = slack[i];
    if (s == none)
      return false;
    const double v = value[start[s]]; // a slack column has one entry
    return v > 0.0 && std::abs(v - 1.0) < 1e-12;
  }

  /// The feasibility tolerance at the size of the right-hand side.
  [[nodiscard]] double feasibility_scale(const options& opt) const {
    double bmax = 1.0;
    for (double v : b)
      bmax = std::max(bmax, std::abs(v));
    return opt.feasibility_tolerance * bmax;
  }

private:
  // The power of two nearest f > 0 in the log scale: 2^e or 2^(e+1) for f = m 2^e, m in [1, 2).
  // Read from the bits of a normal f (a mantissa at or above sqrt(2)'s rounds up).
  static double power_of_two(double f) {
    constexpr std::uint64_t mantissa = (std::uint64_t{1} << 52) - 1;
    constexpr std::uint64_t sqrt2 = std::bit_cast<std::uint64_t>(std::numbers::sqrt2) & mantissa;
    const auto bits = std::bit_cast<std::uint64_t>(f);
    const std::uint64_t exponent = bits >> 52; // f > 0: no sign bit
    if (exponent == 0 || exponent >= 0x7fe) {  // subnormal, or rounding up would overflow
      int e = 0;
      const double m = 2.0 * std::frexp(f, &e);
      return std::ldexp(1.0, e - 1 + (m >= std::numbers::sqrt2 ? 1 : 0));
    }
    return std::bit_cast<double>((exponent + ((bits & mantissa) >= sqrt2 ? 1 : 0)) << 52);
  }

  // The smallest and largest of at(0), ..., at(count - 1) (inf and 0 for none), in four lanes:
  // a single running minimum would wait on each comparison in turn.
  template <class At>
  static std::pair<double, double> range_of(std::size_t count, At&& at) {
    double lo[4] = {inf, inf, inf, inf};
    double hi[4] = {0.0, 0.0, 0.0, 0.0};
    std::size_t k = 0;
    for (; k + 4 <= count; k += 4)
      for (std::size_t u = 0; u < 4; ++u) {
        const double v = at(k + u);
        lo[u] = std::min(lo[u], v);
        hi[u] = std::max(hi[u], v);
      }
    for (; k < count; ++k) {
      const double v = at(k);
      lo[0] = std::min(lo[0], v);
      hi[0] = std::max(hi[0], v);
    }
    return {std::min(std::min(lo[0], lo[1]), std::min(lo[2], lo[3])),
            std::max(std::max(hi[0], hi[1]), std::max(hi[2], hi[3]))};
  }

  // 1 / g for a power of two g, exactly, without a division.
  static double inverse_power_of_two(double g) {
    const std::uint64_t exponent = std::bit_cast<std::uint64_t>(g) >> 52;
    if (exponent == 0 || exponent > 2045) // subnormal, or 1 / g would be
      return 1.0 / g;
    return std::bit_cast<double>((std::uint64_t{2046} - exponent) << 52);
  }

  // Geometric-mean scaling of rows and columns (at most four passes), then each column's largest
  // entry to 1; the objective is scaled so that its largest coefficient is 1.
  //
  // The passes only read: an entry's scaled value is its value times row_scale[i] times
  // col_scale[j] (powers of two, so every product is exact in any order), and the values are
  // scaled once at the end. A pass takes the columns' ranges by columns and the rows' by rows
  // (from the problem's rows), so neither half scatters.
  void scale(std::span<const row> rows) {
    // Entries are nonzero (zero terms are dropped when rows are added).
    std::vector<double> work(2 * m + n);
    const std::span<double> row_lo(work.data(), m);
    const std::span<double> row_hi(work.data() + m, m);
    const std::span<double> col_hi(work.data() + 2 * m, n);
    const std::span<double> r(row_scale);
    const std::span<double> c(col_scale);
    const bool has_split = std::any_of(vars.begin(), vars.end(),
                                       [](const var_map& vm) { return vm.k == var_kind::split; });
    // The rows' ranges at the current factors, and the quality of the scaling: the largest ratio
    // of largest to smallest entry in a row (an empty row gives 0 / inf).
    const auto row_ranges = [&] {
      double q = 1.0;
      for (std::size_t i = 0; i < m; ++i) {
        const std::vector<term>& terms = rows[i].terms;
        auto [l, h] = range_of(terms.size(), [&](std::size_t k) {
          return std::abs(terms[k].coefficient) * c[vars[terms[k].variable].col];
        });
        const auto note = [&](double v) {
          l = std::min(l, v);
          h = std::max(h, v);
        };
        if (has_split)
          for (const term& t : terms)
            if (const var_map& vm = vars[t.variable]; vm.k == var_kind::split)
              note(std::abs(t.coefficient) * c[vm.col2]);
        if (slack[i] != none)
          note(c[slack[i]]);
        row_lo[i] = l * r[i];
        row_hi[i] = h * r[i];
        q = std::max(q, h / l);
      }
      return q;
    };
    double q = row_ranges();
    // A pass that changes nothing has reached the fixed point; one that improves the quality by
    // less than a tenth is not worth another (a dense matrix of similar entries stops after one).
    for (int pass = 0; pass < 4; ++pass) {
      bool changed = false;
      for (std::size_t i = 0; i < m; ++i) {
        const double f =
            row_hi[i] > 0.0 ? power_of_two(1.0 / std::sqrt(row_lo[i] * row_hi[i])) : 1.0;
        r[i] *= f;
        changed = changed || f != 1.0;
      }
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t first = start[j];
        const auto [l, h] = range_of(start[j + 1] - first, [&](std::size_t k) {
          return std::abs(value[first + k]) * r[index[first + k]];
        });
        col_hi[j] = 0.0;
        if (h > 0.0) {
          const double g = power_of_two(1.0 / (c[j] * std::sqrt(l * h)));
          changed = changed || g != 1.0;
          c[j] *= g;
          col_hi[j] = h * c[j];
        }
      }
      const double next = row_ranges();
      if (!changed || !(next < 0.9 * q))
        break;
      q = next;
    }
    for (std::size_t j = 0; j < n; ++j) // each column's largest entry to 1
      if (col_hi[j] > 0.0)
        c[j] *= power_of_two(1.0 / col_hi[j]);
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t e = start[j]; e < start[j + 1]; ++e)
        value[e] *= r[index[e]] * c[j];
      cost[j] *= c[j];
      upper[j] *= inverse_power_of_two(c[j]);
    }
    for (std::size_t i = 0; i < m; ++i)
      b[i] *= r[i];
    double cmax = 0.0;
    for (std::size_t j = 0; j < n; ++j)
      cmax = std::max(cmax, std::abs(cost[j]));
    if (cmax > 0.0) {
      cost_scale = 1.0 / cmax;
      for (std::size_t j = 0; j < n; ++j)
        cost[j] *= cost_scale;
    }
  }
};

/// What a simplex hands back for the answer: per standard column (structural, slack, then
/// one artificial per row) its value, reduced cost and basis membership, and per row the
/// scaled dual y.
struct std_solution {
  std::span<const double> values;        ///< per column
  std::span<const double> reduced_costs; ///< per column (only the first n are read)
  std::span<const char> is_basic;        ///< per column
  std::span<const char> at_upper;        ///< per column
  std::span<const double> y;             ///< per row, scaled
};

/// Whether the basic values lie within their bounds (the feasibility tolerance at the size of
/// the right-hand side, `tol`).
[[nodiscard]] inline bool within_bounds(std::span<const double> beta,
                                        std::span<const std::size_t> basic,
                                        std::span<const double> upper, double tol) {
  for (std::size_t i = 0; i < beta.size(); ++i) {
    const double u = upper[basic[i]];
    if (beta[i] < -tol || (std::isfinite(u) && beta[i] > u + tol * std::max(1.0, u)))
      return false;
  }
  return true;
}

/// The ratio test of a bounded simplex: the entering column moves in direction `dir` (+1 up from
/// its lower bound, -1 down from its upper); `alpha(i)` is its entry in basis row i. The
/// smallest step wins; ties within tolerance go to the lowest variable index. `leave == none`
/// with a finite step is a bound flip; an infinite step means unbounded.
struct ratio_choice {
  double theta = inf;
  std::size_t leave = none;
  bool leave_at_upper = false;
};
template <class Alpha>
[[nodiscard]] ratio_choice ratio_test(Alpha&& alpha, double dir, double enter_upper,
                                      std::span<const double> beta,
                                      std::span<const std::size_t> basic,
                                      std::span<const double> upper, double pivot_tolerance) {
  ratio_choice c;
  c.theta = enter_upper;
  for (std::size_t i = 0; i < beta.size(); ++i) {
    const double g = dir * alpha(i);
    double step = inf;
    bool to_upper = false;
    if (g > pivot_tolerance) {
      step = std::max(beta[i], 0.0) / g;
    } else if (g < -pivot_tolerance && std::isfinite(upper[basic[i]])) {
      step = std::max(upper[basic[i]] - beta[i], 0.0) / -g;
      to_upper = true;
    } else {
      continue;
    }
    const double tie = 1e-12 * std::max(1.0, step);
    if (step < c.theta - tie ||
        (step <= c.theta + tie && c.leave != none && basic[i] < basic[c.leave])) {
      c.theta = step;
      c.leave = i;
      c.leave_at_upper = to_upper;
    }
  }
  return c;
}

// The answer must satisfy the original rows and bounds, not just the scaled problem.
inline void verify(const problem& p, const options& opt, result& res) {
  const auto& vars = p.variables();
  const auto& rows = p.rows();
  const double tol = opt.feasibility_tolerance;
  for (std::size_t j = 0; j < vars.size(); ++j) {
    const double x = res.x[j];
    if (x < vars[j].lower - tol * std::max(1.0, std::abs(vars[j].lower)) ||
        x > vars[j].upper + tol * std::max(1.0, std::abs(vars[j].upper))) {
      res.status = status::numerical_trouble;
      res.message = "variable \"" + vars[j].name + "\" = " + std::to_string(x) +
                    " is outside its bounds after re-checking";
      return;
    }
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double size = std::abs(rows[i].rhs);
    for (const term& t : rows[i].terms)
      size = std::max(size, std::abs(t.coefficient * res.x[t.variable]));
    const double slack = rows[i].rhs - res.row_activity[i];
    const double allowed = tol * std::max(1.0, size);
    const bool ok = rows[i].rel == relation::less_equal      ? slack >= -allowed
                    : rows[i].rel == relation::greater_equal ? slack <= allowed
                                                             : std::abs(slack) <= allowed;
    if (!ok) {
      res.status = status::numerical_trouble;
      res.message = "row \"" + rows[i].name + "\" is violated by " +
                    std::to_string(std::abs(slack)) + " after re-checking";
      return;
    }
  }
}

/// Maps a standard-form solution back to the problem: x, reduced costs, duals, activities,
/// the basis, the objective; re-checks an optimal answer against the original data.
inline result& answer(result& res, const problem& p, const options& opt, const standard_form& sf,
                      const std_solution& s, lp::status st, std::string message) {
  const auto& vars = p.variables();
  const auto& rows = p.rows();
  const double obj_sign = p.sense() == sense::maximize ? -1.0 : 1.0;
  const auto unscaled = [&](std::size_t col) { return s.values[col] * sf.col_scale[col]; };
  const auto rc = [&](std::size_t col) {
    return s.reduced_costs[col] / (sf.col_scale[col] * sf.cost_scale) * obj_sign;
  };
  res.x.assign(vars.size(), 0.0);
  res.reduced_costs.assign(vars.size(), 0.0);
  res.final_basis.variables.assign(vars.size(), basis_status::at_lower);
  for (std::size_t j = 0; j < vars.size(); ++j) {
    const var_map& vm = sf.vars[j];
    basis_status& bs = res.final_basis.variables[j];
    switch (vm.k) {
    case var_kind::shifted:
      res.x[j] = vm.offset + unscaled(vm.col);
      res.reduced_costs[j] = rc(vm.col);
      bs = s.is_basic[vm.col]               ? basis_status::basic
           : vars[j].lower == vars[j].upper ? basis_status::fixed
           : s.at_upper[vm.col]             ? basis_status::at_upper
                                            : basis_status::at_lower;
      break;
    case var_kind::mirrored:
      res.x[j] = vm.offset - unscaled(vm.col);
      res.reduced_costs[j] = -rc(vm.col);
      bs = s.is_basic[vm.col] ? basis_status::basic : basis_status::at_upper;
      break;
    case var_kind::split:
      res.x[j] = unscaled(vm.col) - unscaled(vm.col2);
      res.reduced_costs[j] = rc(vm.col);
      bs =
          s.is_basic[vm.col] || s.is_basic[vm.col2] ? basis_status::basic : basis_status::free_zero;
      break;
    }
  }
  res.row_activity.assign(sf.m, 0.0);
  res.duals.assign(sf.m, 0.0);
  res.final_basis.rows.assign(sf.m, basis_status::basic);
  for (std::size_t i = 0; i < sf.m; ++i) {
    double act = 0.0;
    for (const term& t : rows[i].terms)
      act += t.coefficient * res.x[t.variable];
    res.row_activity[i] = act;
    res.duals[i] = s.y[i] * sf.row_scale[i] * sf.flip[i] / sf.cost_scale * obj_sign;
    if (rows[i].rel == relation::equal)
      res.final_basis.rows[i] = s.is_basic[sf.n + i] ? basis_status::basic : basis_status::fixed;
    else if (!s.is_basic[sf.slack[i]])
      res.final_basis.rows[i] =
          rows[i].rel == relation::less_equal ? basis_status::at_upper : basis_status::at_lower;
  }
  double obj = 0.0;
  for (std::size_t j = 0; j < vars.size(); ++j)
    obj += vars[j].cost * res.x[j];
  res.objective = obj + 0.0;
  for (auto* a : {&res.x, &res.duals, &res.reduced_costs, &res.row_activity})
    for (double& e : *a)
      e += 0.0; // no negative zeros in answers
  res.status = st;
  res.message = std::move(message);
  if (st == status::optimal)
    verify(p, opt, res);
  return res;
}

} // namespace detail
} // namespace hspmd::lp
