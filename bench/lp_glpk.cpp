// The built-in simplex next to GLPK 5 on the same LPs: glp_simplex from the standard basis with
// its defaults (primal simplex, projected steepest edge, no presolve, no scaling) and with its
// dual simplex, run in turn hspmd / GLPK primal / GLPK dual; prints the median of each, the
// ratio to the faster GLPK, and checks that all three reach the same objective. (GLPK's
// "advanced" starting basis was slower on every LP here, so it is not used.)
//
//   build/release/bench/bench.lp_glpk [rounds]       (default 7 rounds)
//
// The LPs: random dense ones (all <= rows, box bounds; as bench.lp) and the sharding-ratio LP in
// its full form (synth/ratio_lp.hpp): per step a compute and a communication time variable, a row
// per (step, kind, device), one ratio per device summing to 1, costs jittered per device so that
// nothing collapses.
#include <hspmd/lp/simplex.hpp>

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace hspmd::lp;

problem random_dense(std::size_t m, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  problem p;
  for (std::size_t j = 0; j < n; ++j)
    p.add_variable("x" + std::to_string(j), 0.0, 10.0, -u(rng));
  for (std::size_t i = 0; i < m; ++i) {
    std::vector<term> t;
    for (std::size_t j = 0; j < n; ++j)
      t.push_back({j, u(rng)});
    p.add_row("r" + std::to_string(i), t, relation::less_equal, static_cast<double>(n) * 2.0);
  }
  return p;
}

// The full-form ratio LP of `steps` steps on `devices` devices (a quarter 1.8x faster).
problem ratio_full(std::size_t steps, std::size_t devices) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  problem p;
  std::vector<std::size_t> r;
  std::vector<term> sum;
  for (std::size_t d = 0; d < devices; ++d) {
    r.push_back(p.add_variable("r" + std::to_string(d)));
    sum.push_back({r.back(), 1.0});
  }
  p.add_row("sum", sum, relation::equal, 1.0);
  for (std::size_t k = 0; k < steps; ++k) {
    const double work = u(rng) * 1e-2;
    const auto tc = p.add_variable("compute" + std::to_string(k), 0.0, inf, 1.0);
    const auto tm = p.add_variable("comm" + std::to_string(k), 0.0, inf, 1.0);
    for (std::size_t d = 0; d < devices; ++d) {
      const double speed = d < devices / 4 ? 1.8 : 1.0;
      p.add_row("c" + std::to_string(k) + "." + std::to_string(d),
                {{tc, 1.0}, {r[d], -work * u(rng) / speed}}, relation::greater_equal, 0.0);
      p.add_row("m" + std::to_string(k) + "." + std::to_string(d),
                {{tm, 1.0}, {r[d], -work * 0.1 * u(rng)}}, relation::greater_equal, 1e-5);
    }
  }
  return p;
}

double glpk_solve(const problem& p, bool dual) {
  glp_prob* g = glp_create_prob();
  glp_set_obj_dir(g, p.sense() == sense::minimize ? GLP_MIN : GLP_MAX);
  const int n = static_cast<int>(p.variable_count());
  const int m = static_cast<int>(p.row_count());
  glp_add_cols(g, n);
  glp_add_rows(g, m);
  for (int j = 1; j <= n; ++j) {
    const auto& v = p.variables()[static_cast<std::size_t>(j - 1)];
    const bool lo = std::isfinite(v.lower);
    const bool hi = std::isfinite(v.upper);
    glp_set_col_bnds(g, j,
                     lo && hi ? GLP_DB
                     : lo     ? GLP_LO
                     : hi     ? GLP_UP
                              : GLP_FR,
                     lo ? v.lower : 0.0, hi ? v.upper : 0.0);
    glp_set_obj_coef(g, j, v.cost);
  }
  std::vector<int> ia{0};
  std::vector<int> ja{0};
  std::vector<double> ar{0.0};
  for (int i = 1; i <= m; ++i) {
    const auto& r = p.rows()[static_cast<std::size_t>(i - 1)];
    glp_set_row_bnds(g, i,
                     r.rel == relation::less_equal      ? GLP_UP
                     : r.rel == relation::greater_equal ? GLP_LO
                                                        : GLP_FX,
                     r.rhs, r.rhs);
    for (const auto& t : r.terms) {
      ia.push_back(i);
      ja.push_back(static_cast<int>(t.variable) + 1);
      ar.push_back(t.coefficient);
    }
  }
  glp_load_matrix(g, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.meth = dual ? GLP_DUALP : GLP_PRIMAL;
  glp_std_basis(g);
  const int rc = glp_simplex(g, &parm);
  const double obj = rc == 0 && glp_get_status(g) == GLP_OPT
                         ? glp_get_obj_val(g)
                         : std::numeric_limits<double>::quiet_NaN();
  glp_delete_prob(g);
  return obj;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  glp_term_out(GLP_OFF);
  struct item {
    std::string name;
    problem p;
  };
  std::vector<item> items;
  for (std::size_t n : {20U, 60U})
    items.push_back(
        {"dense " + std::to_string(n) + "x" + std::to_string(n), random_dense(n, n, 1)});
  for (auto [steps, devices] : {std::pair<std::size_t, std::size_t>{100, 16}, {50, 64}, {100, 64}})
    items.push_back(
        {"ratio full " + std::to_string(steps) + " steps x " + std::to_string(devices) + " devices",
         ratio_full(steps, devices)});
  std::printf("%-34s %10s %9s %9s %9s %6s %7s %s\n", "LP", "rows x cols", "hspmd ms", "GLPK ms",
              "dual ms", "ratio", "pivots", "route");
  int bad = 0;
  for (const item& it : items) {
    // Small LPs are timed over a batch so that each sample is well above the clock's resolution.
    const int batch = it.p.row_count() * it.p.variable_count() < 10000 ? 200 : 1;
    std::vector<double> ours;
    std::vector<double> primal;
    std::vector<double> dual;
    result r;
    double ref = 0.0;
    double ref_dual = 0.0;
    for (int k = 0; k < rounds; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      for (int b = 0; b < batch; ++b)
        r = solve(it.p);
      ours.push_back(seconds_since(t0) / batch);
      t0 = std::chrono::steady_clock::now();
      for (int b = 0; b < batch; ++b)
        ref = glpk_solve(it.p, false);
      primal.push_back(seconds_since(t0) / batch);
      t0 = std::chrono::steady_clock::now();
      for (int b = 0; b < batch; ++b)
        ref_dual = glpk_solve(it.p, true);
      dual.push_back(seconds_since(t0) / batch);
    }
    const auto same = [&](double v) {
      return std::abs(r.objective - v) <= 1e-6 * std::max(1.0, std::abs(v));
    };
    const bool agree = r.status == status::optimal && same(ref) && same(ref_dual);
    bad += agree ? 0 : 1;
    const std::string shape =
        std::to_string(it.p.row_count()) + "x" + std::to_string(it.p.variable_count());
    std::printf("%-34s %10s %9.3f %9.3f %9.3f %5.2fx %7zu %s%s%s\n", it.name.c_str(), shape.c_str(),
                median(ours) * 1e3, median(primal) * 1e3, median(dual) * 1e3,
                std::min(median(primal), median(dual)) / median(ours), r.iterations,
                r.solved_dual ? "dual, " : "primal, ", r.revised ? "revised" : "dense",
                agree ? "" : "  OBJECTIVES DIFFER");
  }
  std::printf("(ratio = the faster GLPK's time / hspmd's; medians of %d rounds in turn)\n", rounds);
  return bad == 0 ? 0 : 1;
}
