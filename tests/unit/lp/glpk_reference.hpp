#pragma once
// GLPK as the reference for the LP tests (test-only dependency).
#include <hspmd/lp/problem.hpp>
#include <hspmd/lp/simplex.hpp>

#include <glpk.h>

#include <cmath>
#include <vector>

namespace lp_test {

struct glpk_answer {
  hspmd::lp::status status = hspmd::lp::status::numerical_trouble;
  double objective = 0.0;
};

inline glpk_answer solve_with_glpk(const hspmd::lp::problem& p) {
  using namespace hspmd::lp;
  glp_term_out(GLP_OFF);
  glp_prob* g = glp_create_prob();
  glp_set_obj_dir(g, p.sense() == sense::minimize ? GLP_MIN : GLP_MAX);
  const int n = static_cast<int>(p.variable_count());
  const int m = static_cast<int>(p.row_count());
  if (n > 0)
    glp_add_cols(g, n);
  if (m > 0)
    glp_add_rows(g, m);
  for (int j = 1; j <= n; ++j) {
    const auto& v = p.variables()[static_cast<std::size_t>(j - 1)];
    const bool lo = std::isfinite(v.lower);
    const bool hi = std::isfinite(v.upper);
    const int type = lo && hi ? (v.lower == v.upper ? GLP_FX : GLP_DB)
                     : lo     ? GLP_LO
                     : hi     ? GLP_UP
                              : GLP_FR;
    glp_set_col_bnds(g, j, type, lo ? v.lower : 0.0, hi ? v.upper : 0.0);
    glp_set_obj_coef(g, j, v.cost);
  }
  std::vector<int> ia{0};
  std::vector<int> ja{0};
  std::vector<double> ar{0.0};
  for (int i = 1; i <= m; ++i) {
    const auto& r = p.rows()[static_cast<std::size_t>(i - 1)];
    const int type = r.rel == relation::less_equal      ? GLP_UP
                     : r.rel == relation::greater_equal ? GLP_LO
                                                        : GLP_FX;
    glp_set_row_bnds(g, i, type, r.rhs, r.rhs);
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
  parm.presolve = GLP_OFF;
  glp_adv_basis(g, 0);
  const int rc = glp_simplex(g, &parm);
  glpk_answer a;
  if (rc == 0) {
    switch (glp_get_status(g)) {
    case GLP_OPT:
      a.status = status::optimal;
      a.objective = glp_get_obj_val(g);
      break;
    case GLP_NOFEAS:
      a.status = status::infeasible;
      break;
    case GLP_UNBND:
      a.status = status::unbounded;
      break;
    default:
      break;
    }
  }
  glp_delete_prob(g);
  return a;
}

} // namespace lp_test
