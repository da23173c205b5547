// The built-in simplex against GLPK on seeded random LPs of every family, on the classic hard
// cases, and through its optimality certificate (duals and reduced costs).
#include "glpk_reference.hpp"

#include <hspmd/lp/problem.hpp>
#include <hspmd/lp/revised.hpp>
#include <hspmd/lp/simplex.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace hspmd::lp;

namespace {

enum class family { feasible, infeasible, unbounded, degenerate, equality_heavy, free_vars };
constexpr family families[] = {family::feasible,   family::infeasible,     family::unbounded,
                               family::degenerate, family::equality_heavy, family::free_vars};
const char* family_name(family f) {
  constexpr const char* names[] = {"feasible",   "infeasible",     "unbounded",
                                   "degenerate", "equality-heavy", "free variables"};
  return names[static_cast<int>(f)];
}

// A seeded random LP of one family, m rows by n variables, built around a known feasible point.
problem random_lp(std::mt19937_64& rng, family f, std::size_t m, std::size_t n) {
  std::uniform_int_distribution<int> small(-9, 9);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  problem p(unit(rng) < 0.5 ? sense::minimize : sense::maximize);
  const double density = 0.3 + 0.7 * unit(rng);
  std::vector<double> x_star(n);
  for (std::size_t j = 0; j < n; ++j) {
    double lo = static_cast<double>(small(rng)) / 2.0;
    double hi = lo + 1.0 + static_cast<double>(std::abs(small(rng)));
    const bool fixed = unit(rng) < 0.05;
    if (fixed)
      hi = lo;
    double x = lo + (hi - lo) * (f == family::degenerate ? std::round(unit(rng)) : unit(rng));
    if (f == family::free_vars && unit(rng) < 0.5) { // free or one-sided
      const double r = unit(rng);
      lo = r < 0.4 ? -inf : lo;
      hi = r > 0.2 && r < 0.7 ? hi : inf;
      if (lo == -inf && hi == inf)
        x = static_cast<double>(small(rng));
    }
    x_star[j] = x;
    p.add_variable("x" + std::to_string(j), lo, hi, static_cast<double>(small(rng)) + unit(rng));
  }
  // In free_vars LPs an unbounded direction may exist; box every variable through rows then.
  const std::size_t eq_rows = f == family::equality_heavy ? std::min(m, n - 1) : m / 5;
  for (std::size_t i = 0; i < m; ++i) {
    std::vector<term> terms;
    double act = 0.0;
    for (std::size_t j = 0; j < n; ++j)
      if (unit(rng) < density) {
        const double a = static_cast<double>(small(rng)) + (unit(rng) < 0.5 ? 0.0 : unit(rng));
        terms.push_back({j, a});
        act += a * x_star[j];
      }
    const double slack = f == family::degenerate || unit(rng) < 0.3 ? 0.0 : 5.0 * unit(rng);
    if (i < eq_rows) {
      p.add_row("r" + std::to_string(i), terms, relation::equal, act);
      if (f == family::equality_heavy && unit(rng) < 0.3) { // a redundant copy, scaled
        for (term& t : terms)
          t.coefficient *= 2.0;
        p.add_row("r" + std::to_string(i) + "copy", terms, relation::equal, 2.0 * act);
      }
    } else if (unit(rng) < 0.5) {
      p.add_row("r" + std::to_string(i), terms, relation::less_equal, act + slack);
    } else {
      p.add_row("r" + std::to_string(i), terms, relation::greater_equal, act - slack);
    }
  }
  if (f == family::free_vars)
    for (std::size_t j = 0; j < n; ++j) // keep it bounded: |x_j| <= 100 as rows
      if (!std::isfinite(p.variables()[j].lower) || !std::isfinite(p.variables()[j].upper)) {
        p.add_row("box+" + std::to_string(j), {{j, 1.0}}, relation::less_equal, 100.0);
        p.add_row("box-" + std::to_string(j), {{j, 1.0}}, relation::greater_equal, -100.0);
      }
  if (f == family::infeasible) { // two rows that contradict each other
    std::vector<term> terms;
    for (std::size_t j = 0; j < n; ++j)
      terms.push_back({j, static_cast<double>(small(rng))});
    terms[0].coefficient = 1.0;
    p.add_row("lo", terms, relation::greater_equal, 3.0);
    p.add_row("hi", terms, relation::less_equal, 2.0);
  }
  if (f == family::unbounded) { // a ray: a new variable that only loosens rows and improves
    const std::size_t ray =
        p.add_variable("ray", 0.0, inf, p.sense() == sense::minimize ? -1.0 : 1.0);
    for (std::size_t i = 0; i < p.row_count(); ++i) {
      const relation rel = p.rows()[i].rel;
      if (rel == relation::equal)
        continue;
      (void)ray; // the ray appears in no row: nothing limits it
    }
  }
  return p;
}

double scale_of(const problem& p) {
  double s = 1.0;
  for (const auto& v : p.variables())
    s = std::max(s, std::abs(v.cost));
  for (const auto& r : p.rows())
    s = std::max(s, std::abs(r.rhs));
  return s;
}

// The optimality certificate: primal feasibility, dual signs, complementary slackness,
// reduced costs consistent with the duals, and strong duality.
void check_certificate(const problem& p, const result& r) {
  const double tol = 1e-6 * scale_of(p);
  const double sgn = p.sense() == sense::minimize ? 1.0 : -1.0;
  double dual_objective = 0.0;
  for (std::size_t i = 0; i < p.row_count(); ++i) {
    const auto& row = p.rows()[i];
    const double y = r.duals[i] * sgn; // as for a minimization
    const double slack = row.rhs - r.row_activity[i];
    CAPTURE(row.name, y, slack);
    if (row.rel == relation::less_equal) {
      CHECK(slack >= -tol);
      CHECK(y <= tol);
    } else if (row.rel == relation::greater_equal) {
      CHECK(slack <= tol);
      CHECK(y >= -tol);
    } else {
      CHECK(std::abs(slack) <= tol);
    }
    CHECK(std::abs(y * slack) <= tol * std::max(1.0, std::abs(y)));
    dual_objective += r.duals[i] * row.rhs;
  }
  std::vector<double> aty(p.variable_count(), 0.0);
  for (std::size_t i = 0; i < p.row_count(); ++i)
    for (const auto& t : p.rows()[i].terms)
      aty[t.variable] += t.coefficient * r.duals[i];
  for (std::size_t j = 0; j < p.variable_count(); ++j) {
    const auto& v = p.variables()[j];
    const double d = r.reduced_costs[j];
    CAPTURE(v.name, r.x[j], d);
    CHECK(std::abs(d - (v.cost - aty[j])) <= tol);
    CHECK(r.x[j] >= v.lower - tol);
    CHECK(r.x[j] <= v.upper + tol);
    const bool at_lower = r.x[j] <= v.lower + tol;
    const bool at_upper = r.x[j] >= v.upper - tol;
    if (!at_lower && !at_upper)
      CHECK(std::abs(d) <= tol);
    else if (at_lower && !at_upper)
      CHECK(d * sgn >= -tol);
    else if (at_upper && !at_lower)
      CHECK(d * sgn <= tol);
    dual_objective += d * r.x[j];
  }
  CHECK(std::abs(dual_objective - r.objective) <= tol * 10);
}

// `count` seeded random LPs of every family solved with `opt`, each checked against GLPK.
void agree_with_glpk(std::uint64_t seed, int count, const options& opt) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> size(2, 60);
  int solved = 0;
  int by_status[5] = {};
  for (int k = 0; k < count; ++k) {
    const family f = families[k % 6];
    const std::size_t m = size(rng);
    const std::size_t n = size(rng);
    const problem p = random_lp(rng, f, m, n);
    const result ours = solve(p, opt);
    const auto ref = lp_test::solve_with_glpk(p);
    CAPTURE(k, family_name(f), m, n, ours.message);
    REQUIRE(ref.status != status::numerical_trouble);
    CHECK(name(ours.status) == name(ref.status));
    ++by_status[static_cast<int>(ours.status)];
    if (ours.status == status::optimal && ref.status == status::optimal) {
      CHECK(std::abs(ours.objective - ref.objective) <=
            1e-6 * std::max(1.0, std::abs(ref.objective)));
      check_certificate(p, ours);
      ++solved;
    }
  }
  WARN(count << " LPs: " << by_status[0] << " optimal, " << by_status[1] << " infeasible, "
             << by_status[2] << " unbounded, " << by_status[3] << " iteration limit, "
             << by_status[4] << " numerical trouble");
  CHECK(by_status[0] >= count / 2); // every family is represented
  CHECK(by_status[1] >= count / 8);
  CHECK(by_status[2] >= count / 8);
}

options with(options::method m, options::formulation f = options::formulation::automatic) {
  options o;
  o.algorithm = m;
  o.form = f;
  return o;
}

} // namespace

TEST_CASE("1200 seeded random LPs agree with GLPK: status, objective, feasibility, certificate") {
  agree_with_glpk(20261121, 1200, {});
}

TEST_CASE("the revised simplex agrees with GLPK on every family, primal and dual routes") {
  agree_with_glpk(20261125, 600, with(options::method::revised));
  agree_with_glpk(20261126, 240, with(options::method::revised, options::formulation::dual));
}

TEST_CASE("Beale's cycling example terminates at the optimum") {
  // min -3/4 x4 + 20 x5 - 1/2 x6 + 6 x7: cycles under Dantzig's rule with a naive tie-break.
  problem p;
  const auto x4 = p.add_variable("x4", 0, inf, -0.75);
  const auto x5 = p.add_variable("x5", 0, inf, 20);
  const auto x6 = p.add_variable("x6", 0, inf, -0.5);
  const auto x7 = p.add_variable("x7", 0, inf, 6);
  p.add_row("r1", {{x4, 0.25}, {x5, -8}, {x6, -1}, {x7, 9}}, relation::less_equal, 0);
  p.add_row("r2", {{x4, 0.5}, {x5, -12}, {x6, -0.5}, {x7, 3}}, relation::less_equal, 0);
  p.add_row("r3", {{x6, 1}}, relation::less_equal, 1);
  options no_scaling;
  no_scaling.scale = false; // the cycle needs the original numbers
  for (const options& o : {options{}, no_scaling}) {
    const result r = solve(p, o);
    REQUIRE(r.status == status::optimal);
    CHECK(r.objective == Approx(-1.25));
    CHECK(r.x[x4] == Approx(1.0));
    CHECK(r.x[x6] == Approx(1.0));
    check_certificate(p, r);
  }
}

TEST_CASE("Klee-Minty (n = 8) terminates at 5^8") {
  constexpr int n = 8;
  problem p(sense::maximize);
  std::vector<std::size_t> x;
  for (int j = 0; j < n; ++j)
    x.push_back(p.add_variable("x" + std::to_string(j), 0, inf, std::pow(2.0, n - 1 - j)));
  for (int i = 0; i < n; ++i) {
    std::vector<term> terms;
    for (int j = 0; j < i; ++j)
      terms.push_back({x[static_cast<std::size_t>(j)], std::pow(2.0, i - j + 1)});
    terms.push_back({x[static_cast<std::size_t>(i)], 1.0});
    p.add_row("r" + std::to_string(i), terms, relation::less_equal, std::pow(5.0, i + 1));
  }
  const result r = solve(p);
  REQUIRE(r.status == status::optimal);
  CHECK(r.objective == Approx(std::pow(5.0, n)));
  CHECK(r.x[x.back()] == Approx(std::pow(5.0, n)));
  check_certificate(p, r);
}

TEST_CASE("redundant equality rows and free variables") {
  problem p;
  const auto a = p.add_variable("a", 0, inf, 1);
  const auto b = p.add_variable("b", 0, inf, 2);
  const auto c = p.add_variable("c", 0, inf, 3);
  p.add_row("sum", {{a, 1}, {b, 1}, {c, 1}}, relation::equal, 3);
  p.add_row("sum twice", {{a, 2}, {b, 2}, {c, 2}}, relation::equal, 6); // redundant
  p.add_row("a=b", {{a, 1}, {b, -1}}, relation::equal, 0);
  p.add_row("sum again", {{a, 1}, {b, 1}, {c, 1}}, relation::equal, 3); // redundant
  const result r = solve(p);
  REQUIRE(r.status == status::optimal);
  CHECK(r.objective == Approx(4.5)); // a = b = 1.5, c = 0
  check_certificate(p, r);

  // min |x - 3| + |y + 1| with x, y free, written with free helper variables.
  problem q;
  const auto x = q.add_variable("x", -inf, inf);
  const auto y = q.add_variable("y", -inf, inf);
  const auto t = q.add_variable("t", -inf, inf, 1);
  const auto u = q.add_variable("u", -inf, inf, 1);
  q.add_row("t>=x-3", {{t, 1}, {x, -1}}, relation::greater_equal, -3);
  q.add_row("t>=3-x", {{t, 1}, {x, 1}}, relation::greater_equal, 3);
  q.add_row("u>=y+1", {{u, 1}, {y, -1}}, relation::greater_equal, 1);
  q.add_row("u>=-y-1", {{u, 1}, {y, 1}}, relation::greater_equal, -1);
  q.add_row("x+y=4", {{x, 1}, {y, 1}}, relation::equal, 4);
  const result s = solve(q);
  REQUIRE(s.status == status::optimal);
  CHECK(s.objective == Approx(2.0)); // x + y = 4 forces |x-3| + |y+1| >= |(x+y) - 2| = 2
  check_certificate(q, s);
}

TEST_CASE("warm start: a small change re-solves in a few pivots to the cold answer") {
  // A sharding-shaped LP: minimize t, t >= w_d * r_d, sum r = 1.
  const std::vector<double> work = {1.0, 1.2, 0.9, 2.0, 1.8, 1.1, 0.7, 1.5};
  problem p;
  const auto t = p.add_variable("t", 0, inf, 1);
  std::vector<std::size_t> r;
  std::vector<term> sum;
  for (std::size_t d = 0; d < work.size(); ++d) {
    r.push_back(p.add_variable("r" + std::to_string(d)));
    sum.push_back({r.back(), 1.0});
    p.add_row("dev" + std::to_string(d), {{t, 1}, {r.back(), -work[d]}}, relation::greater_equal,
              0);
  }
  p.add_row("sum", sum, relation::equal, 1);
  const result cold = solve(p);
  REQUIRE(cold.status == status::optimal);
  // Device 3 gets 10% slower: one coefficient changes.
  problem q;
  const auto t2 = q.add_variable("t", 0, inf, 1);
  sum.clear();
  for (std::size_t d = 0; d < work.size(); ++d) {
    const auto v = q.add_variable("r" + std::to_string(d));
    sum.push_back({v, 1.0});
    q.add_row("dev" + std::to_string(d), {{t2, 1}, {v, -(d == 3 ? 2.2 : work[d])}},
              relation::greater_equal, 0);
  }
  q.add_row("sum", sum, relation::equal, 1);
  const result again = solve(q);
  const result warm = solve(q, {}, &cold.final_basis);
  REQUIRE(again.status == status::optimal);
  REQUIRE(warm.status == status::optimal);
  CHECK(warm.warm_started);
  CHECK(warm.objective == Approx(again.objective).epsilon(1e-12));
  CHECK(warm.iterations <= 3);
  CHECK(warm.iterations < again.iterations);
  // A basis that does not fit is ignored, not trusted.
  basis wrong = cold.final_basis;
  wrong.rows.pop_back();
  CHECK_FALSE(solve(q, {}, &wrong).warm_started);
}

TEST_CASE("deterministic: the same input gives bit-identical output") {
  std::mt19937_64 rng(7);
  for (int k = 0; k < 20; ++k) {
    const problem p = random_lp(rng, families[k % 6], 30, 25);
    const result a = solve(p);
    const result b = solve(p);
    CHECK(a.status == b.status);
    CHECK(a.iterations == b.iterations);
    CHECK(std::memcmp(a.x.data(), b.x.data(), a.x.size() * sizeof(double)) == 0);
    CHECK(std::memcmp(a.duals.data(), b.duals.data(), a.duals.size() * sizeof(double)) == 0);
    CHECK(a.final_basis == b.final_basis);
  }
}

TEST_CASE("bad builder input is refused with the name, limits are statuses") {
  problem p;
  CHECK_THROWS_WITH(p.add_variable("v", 2, 1), Catch::Contains("lp variable \"v\""));
  const auto v = p.add_variable("v", 0, 10, 1);
  CHECK_THROWS_WITH(p.add_row("r", {{v + 1, 1.0}}, relation::equal, 1),
                    Catch::Contains("lp row \"r\": unknown variable index 1"));
  CHECK_THROWS_AS(p.add_row("r", {{v, std::nan("")}}, relation::equal, 1), hspmd::plan_error);
  std::mt19937_64 rng(3);
  const problem big = random_lp(rng, family::feasible, 40, 40);
  options tight;
  tight.iteration_limit = 3;
  const result r = solve(big, tight);
  CHECK(r.status == status::iteration_limit);
  CHECK(r.iterations == 3);
}

TEST_CASE("the dual formulation agrees with GLPK on every family, statuses included") {
  std::mt19937_64 rng(424242);
  std::uniform_int_distribution<std::size_t> size(2, 40);
  options via_dual;
  via_dual.form = options::formulation::dual;
  for (int k = 0; k < 300; ++k) {
    const family f = families[k % 6];
    const problem p = random_lp(rng, f, size(rng), size(rng));
    const result ours = solve(p, via_dual);
    const auto ref = lp_test::solve_with_glpk(p);
    CAPTURE(k, family_name(f), p.row_count(), p.variable_count(), ours.message);
    CHECK(ours.solved_dual);
    CHECK(name(ours.status) == name(ref.status));
    if (ours.status == status::optimal && ref.status == status::optimal) {
      CHECK(std::abs(ours.objective - ref.objective) <=
            1e-6 * std::max(1.0, std::abs(ref.objective)));
      check_certificate(p, ours);
    }
  }
}

namespace {
// A HAP-shaped LP: per step and device, t_s >= compute + communication as a linear function of
// the device's ratio; ratios sum to 1; minimize the sum of step times. Rows >> columns.
problem sharding_shaped(std::mt19937_64& rng, std::size_t steps, std::size_t devices) {
  std::uniform_real_distribution<double> u(0.5, 2.0);
  problem p;
  std::vector<std::size_t> r;
  std::vector<term> sum;
  for (std::size_t d = 0; d < devices; ++d) {
    r.push_back(p.add_variable("r" + std::to_string(d)));
    sum.push_back({r.back(), 1.0});
  }
  p.add_row("ratios", sum, relation::equal, 1.0);
  for (std::size_t s = 0; s < steps; ++s) {
    const auto t = p.add_variable("t" + std::to_string(s), 0, inf, 1.0);
    for (std::size_t d = 0; d < devices; ++d)
      p.add_row("s" + std::to_string(s) + "d" + std::to_string(d),
                {{t, 1.0}, {r[d], -u(rng) * 1e-3}}, relation::greater_equal, u(rng) * 1e-5);
  }
  return p;
}
} // namespace

TEST_CASE("tall LPs go through the dual and agree with GLPK and with the primal route") {
  std::mt19937_64 rng(99);
  for (const auto& [steps, devices] : {std::pair<std::size_t, std::size_t>{30, 8}, {60, 16}}) {
    const problem p = sharding_shaped(rng, steps, devices); // e.g. 960 rows, 76 columns
    const result fast = solve(p);
    CAPTURE(p.row_count(), p.variable_count(), fast.message);
    REQUIRE(fast.status == status::optimal);
    CHECK(fast.solved_dual);
    const auto ref = lp_test::solve_with_glpk(p);
    CHECK(fast.objective == Approx(ref.objective).epsilon(1e-9));
    check_certificate(p, fast);
    if (steps == 30) { // the primal route on the same problem (slow for the larger one)
      options primal;
      primal.form = options::formulation::primal;
      const result slow = solve(p, primal);
      REQUIRE(slow.status == status::optimal);
      CHECK(slow.objective == Approx(fast.objective).epsilon(1e-9));
    }
    // Warm start through the dual: device 0's constant costs grow by 50%.
    problem q = p;
    for (std::size_t i = 1; i < q.row_count(); i += devices)
      q.set_rhs(i, q.rows()[i].rhs * 1.5);
    const result cold_q = solve(q);
    const result warm = solve(q, {}, &fast.final_basis);
    REQUIRE(warm.status == status::optimal);
    CHECK(warm.warm_started);
    CHECK(warm.iterations <= cold_q.iterations);
    CHECK(warm.objective == Approx(cold_q.objective).epsilon(1e-12));
    WARN("tall LP " << p.row_count() << "x" << p.variable_count() << ": cold " << fast.iterations
                    << " iterations, warm re-solve after a change " << warm.iterations);
  }
}

TEST_CASE("warm starts from a basis made infeasible by the change reach the cold answer") {
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<double> jitter(-0.5, 0.5);
  int infeasible_starts = 0;
  for (int k = 0; k < 150; ++k) {
    const problem p = random_lp(rng, k % 2 == 0 ? family::feasible : family::degenerate, 25, 20);
    const result before = solve(p);
    if (before.status != status::optimal)
      continue;
    problem q = p; // move every right-hand side a little
    for (std::size_t i = 0; i < q.row_count(); ++i)
      q.set_rhs(i, q.rows()[i].rhs + jitter(rng));
    const result cold = solve(q);
    const result warm = solve(q, {}, &before.final_basis);
    CAPTURE(k, cold.message, warm.message);
    CHECK(warm.warm_started);
    CHECK(name(warm.status) == name(cold.status));
    if (cold.status == status::optimal && warm.status == status::optimal) {
      CHECK(warm.objective == Approx(cold.objective).epsilon(1e-9).margin(1e-9));
      check_certificate(q, warm);
    }
    infeasible_starts += warm.phase1_iterations > 0 ? 1 : 0;
  }
  CHECK(infeasible_starts > 20); // the single-artificial path was exercised
}

TEST_CASE("revised simplex: warm starts, determinism and the ratio LP's full form") {
  const options revised = with(options::method::revised);
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<double> jitter(-0.5, 0.5);
  int infeasible_starts = 0;
  for (int k = 0; k < 100; ++k) {
    const problem p = random_lp(rng, k % 2 == 0 ? family::feasible : family::degenerate, 25, 20);
    const result before = solve(p, revised);
    CHECK(before.revised);
    const result again = solve(p, revised);
    CHECK(again.iterations == before.iterations);
    CHECK(std::memcmp(again.x.data(), before.x.data(), p.variable_count() * sizeof(double)) == 0);
    CHECK(again.final_basis == before.final_basis);
    if (before.status != status::optimal)
      continue;
    problem q = p;
    for (std::size_t i = 0; i < q.row_count(); ++i)
      q.set_rhs(i, q.rows()[i].rhs + jitter(rng));
    const result cold = solve(q, revised);
    const result warm = solve(q, revised, &before.final_basis);
    CAPTURE(k, cold.message, warm.message);
    CHECK(warm.warm_started);
    CHECK(name(warm.status) == name(cold.status));
    if (cold.status == status::optimal && warm.status == status::optimal) {
      CHECK(warm.objective == Approx(cold.objective).epsilon(1e-9).margin(1e-9));
      check_certificate(q, warm);
    }
    infeasible_starts += warm.phase1_iterations > 0 ? 1 : 0;
  }
  CHECK(infeasible_starts > 10);

  // The ratio LP's full form through the dual: the automatic choice is the revised simplex; it
  // agrees with the dense tableau and GLPK, and a warm re-solve after a change takes few pivots.
  const problem p = sharding_shaped(rng, 100, 16); // 1601 rows x 116 columns
  const result fast = solve(p);
  REQUIRE(fast.status == status::optimal);
  CHECK(fast.solved_dual);
  CHECK(fast.revised);
  const result dense = solve(p, with(options::method::dense));
  REQUIRE(dense.status == status::optimal);
  CHECK_FALSE(dense.revised);
  CHECK(fast.objective == Approx(dense.objective).epsilon(1e-9));
  CHECK(fast.objective == Approx(lp_test::solve_with_glpk(p).objective).epsilon(1e-9));
  check_certificate(p, fast);
  problem q = p;
  for (std::size_t i = 1; i < q.row_count(); i += 16)
    q.set_rhs(i, q.rows()[i].rhs * 1.5);
  const result cold_q = solve(q);
  const result warm = solve(q, {}, &fast.final_basis);
  REQUIRE(warm.status == status::optimal);
  CHECK(warm.warm_started);
  CHECK(warm.iterations < cold_q.iterations);
  CHECK(warm.objective == Approx(cold_q.objective).epsilon(1e-12));
}

TEST_CASE("sparse LU: solves with B and its transpose, through product-form updates") {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (const std::size_t m : {1U, 7U, 40U}) {
    // A sparse nonsingular matrix: a strong diagonal under a random permutation plus noise.
    std::vector<std::size_t> perm(m);
    for (std::size_t i = 0; i < m; ++i)
      perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<std::vector<double>> cols(m, std::vector<double>(m, 0.0)); // cols[k][row]
    for (std::size_t k = 0; k < m; ++k) {
      cols[k][perm[k]] = 4.0 + u(rng);
      for (std::size_t i = 0; i < m; ++i)
        if (coin(rng) < 0.1)
          cols[k][i] += u(rng);
    }
    hspmd::lp::detail::sparse_lu lu;
    const auto factor = [&] {
      return lu.factor(m, [&](std::size_t k, auto&& add) {
        for (std::size_t i = 0; i < m; ++i)
          add(i, cols[k][i]);
      });
    };
    REQUIRE(factor());
    const auto check = [&] {
      std::vector<double> a(m);
      for (double& v : a)
        v = u(rng);
      std::vector<double> work = a;
      std::vector<double> x;
      lu.ftran(work, x); // B x = a
      for (std::size_t i = 0; i < m; ++i) {
        double s = 0.0;
        for (std::size_t k = 0; k < m; ++k)
          s += cols[k][i] * x[k];
        CHECK(s == Approx(a[i]).margin(1e-10));
      }
      work = a;
      std::vector<double> y;
      lu.btran(work, y); // y B = a
      for (std::size_t k = 0; k < m; ++k) {
        double s = 0.0;
        for (std::size_t i = 0; i < m; ++i)
          s += y[i] * cols[k][i];
        CHECK(s == Approx(a[k]).margin(1e-10));
      }
    };
    check();
    for (int t = 0; t < 5; ++t) { // replace a column: the new B is B with column r swapped
      std::vector<double> c(m);
      for (double& v : c)
        v = u(rng);
      const std::size_t r = static_cast<std::size_t>(t) % m;
      c[perm[r]] += 8.0;
      std::vector<double> work = c;
      std::vector<double> alpha;
      lu.ftran(work, alpha);
      lu.update(r, alpha);
      cols[r] = c;
      check();
    }
    CHECK(lu.updates() == 5);
    REQUIRE(factor());
    CHECK(lu.updates() == 0);
    check();
  }
  // A singular matrix (two equal columns) is refused.
  hspmd::lp::detail::sparse_lu lu;
  CHECK_FALSE(lu.factor(3, [](std::size_t k, auto&& add) {
    add(0, 1.0);
    add(1, k == 2 ? 0.0 : 2.0);
    add(2, k == 2 ? 5.0 : 3.0);
  }));
}
