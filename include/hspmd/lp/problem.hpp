#pragma once
// Linear programs: variables with bounds (free and fixed ones included), rows with <=, >= or =,
// minimize or maximize, names for messages.
//
//     lp::problem p(lp::sense::minimize);
//     auto x = p.add_variable("x", 0, lp::inf, 1.0);      // 0 <= x, cost 1
//     auto y = p.add_variable("y", -lp::inf, lp::inf);    // free
//     p.add_row("cap", {{x, 1.0}, {y, 2.0}}, lp::relation::less_equal, 4.0);
//
// Bad input (an unknown variable, lower > upper, a NaN coefficient) throws `plan_error` naming
// the variable or row; an infeasible or unbounded problem is not an error but a solver status.

#include <hspmd/core/error.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::lp {

/// Infinity for bounds: `lp::inf` / `-lp::inf`.
inline constexpr double inf = std::numeric_limits<double>::infinity();

/// Direction of optimization.
enum class sense : unsigned char { minimize, maximize };

/// How a row relates its activity a . x to its right-hand side.
enum class relation : unsigned char { less_equal, greater_equal, equal };

/// One coefficient of a row: (variable index, value).
struct term {
  std::size_t variable = 0;
  double coefficient = 0.0;
};

/// A variable: lower <= x <= upper (either may be infinite), objective coefficient `cost`.
struct variable {
  std::string name;
  double lower = 0.0;
  double upper = inf;
  double cost = 0.0;
};

/// A row: sum of terms (relation) rhs. Terms are merged per variable.
struct row {
  std::string name;
  std::vector<term> terms;
  relation rel = relation::less_equal;
  double rhs = 0.0;
};

/// A linear program.
class problem {
public:
  explicit problem(lp::sense s = lp::sense::minimize) : sense_(s) {}

  /// Adds a variable and returns its index. Throws `plan_error` if lower > upper, lower = +inf,
  /// upper = -inf, or a value is NaN.
  std::size_t add_variable(std::string name, double lower = 0.0, double upper = inf,
                           double cost = 0.0) {
    check_bounds(name, lower, upper);
    if (!std::isfinite(cost))
      throw plan_error("lp variable \"" + name + "\"", "cost " + std::to_string(cost),
                       "a finite objective coefficient");
    variables_.push_back({std::move(name), lower, upper, cost});
    return variables_.size() - 1;
  }

  /// Adds a row and returns its index. Terms on the same variable are summed; zero terms are
  /// dropped. Throws `plan_error` for an unknown variable, a non-finite coefficient or rhs.
  std::size_t add_row(std::string name, std::vector<term> terms, relation rel, double rhs) {
    if (!std::isfinite(rhs))
      throw plan_error("lp row \"" + name + "\"", "right-hand side " + std::to_string(rhs),
                       "a finite right-hand side");
    std::vector<term> merged;
    for (const term& t : terms) {
      if (t.variable >= variables_.size())
        throw plan_error("lp row \"" + name + "\"",
                         "unknown variable index " + std::to_string(t.variable),
                         "add the variable before the row");
      if (!std::isfinite(t.coefficient))
        throw plan_error("lp row \"" + name + "\"",
                         "coefficient of \"" + variables_[t.variable].name + "\" is " +
                             std::to_string(t.coefficient),
                         "finite coefficients");
      bool found = false;
      for (term& m : merged)
        if (m.variable == t.variable) {
          m.coefficient += t.coefficient;
          found = true;
        }
      if (!found)
        merged.push_back(t);
    }
    std::erase_if(merged, [](const term& t) { return t.coefficient == 0.0; });
    rows_.push_back({std::move(name), std::move(merged), rel, rhs});
    return rows_.size() - 1;
  }

  /// Changes a variable's objective coefficient.
  void set_cost(std::size_t var, double cost) {
    at(var).cost = cost;
    if (!std::isfinite(cost))
      throw plan_error("lp variable \"" + variables_[var].name + "\"", "non-finite cost",
                       "a finite objective coefficient");
  }
  /// Changes a variable's bounds.
  void set_bounds(std::size_t var, double lower, double upper) {
    check_bounds(at(var).name, lower, upper);
    variables_[var].lower = lower;
    variables_[var].upper = upper;
  }
  /// Changes a row's right-hand side.
  void set_rhs(std::size_t r, double rhs) {
    if (r >= rows_.size() || !std::isfinite(rhs))
      throw plan_error("lp row " + std::to_string(r), "no such row or non-finite rhs",
                       "an existing row and a finite value");
    rows_[r].rhs = rhs;
  }

  [[nodiscard]] lp::sense sense() const noexcept { return sense_; }
  [[nodiscard]] const std::vector<variable>& variables() const noexcept { return variables_; }
  [[nodiscard]] const std::vector<row>& rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t variable_count() const noexcept { return variables_.size(); }
  [[nodiscard]] std::size_t row_count() const noexcept { return rows_.size(); }

private:
  variable& at(std::size_t var) {
    if (var >= variables_.size())
      throw plan_error("lp variable " + std::to_string(var), "no such variable",
                       "an index returned by add_variable");
    return variables_[var];
  }
  static void check_bounds(const std::string& name, double lower, double upper) {
    if (std::isnan(lower) || std::isnan(upper) || lower > upper || lower == inf || upper == -inf)
      throw plan_error("lp variable \"" + name + "\"",
                       "bounds [" + std::to_string(lower) + ", " + std::to_string(upper) + "]",
                       "lower <= upper, lower < +inf, upper > -inf");
  }

  lp::sense sense_;
  std::vector<variable> variables_;
  std::vector<row> rows_;
};

} // namespace hspmd::lp
