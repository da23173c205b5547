#include <hspmd/exec/backends/host.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

using namespace hspmd;

TEMPLATE_TEST_CASE("gemm matches the definition for every transpose and leading dimension", "",
                   float, double) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(-1, 1);
  for (const auto& [m, n, k] : {std::tuple{1UL, 1UL, 1UL},
                                {3UL, 5UL, 7UL},
                                {17UL, 4UL, 33UL},
                                {0UL, 3UL, 2UL},
                                {2UL, 3UL, 0UL}})
    for (const auto ta : {exec::transpose::no, exec::transpose::yes})
      for (const auto tb : {exec::transpose::no, exec::transpose::yes}) {
        // Stored shapes (with 2 extra columns of padding to exercise leading dimensions).
        const std::size_t ar = ta == exec::transpose::yes ? k : m;
        const std::size_t ac = ta == exec::transpose::yes ? m : k;
        const std::size_t br = tb == exec::transpose::yes ? n : k;
        const std::size_t bc = tb == exec::transpose::yes ? k : n;
        const std::size_t lda = ac + 2, ldb = bc + 2, ldc = n + 2;
        std::vector<TestType> a(ar * lda), b(br * ldb), c(m * ldc);
        for (auto& v : a)
          v = static_cast<TestType>(u(rng));
        for (auto& v : b)
          v = static_cast<TestType>(u(rng));
        for (auto& v : c)
          v = static_cast<TestType>(u(rng));
        std::vector<TestType> want = c;
        const TestType alpha = 0.5, beta = -2;
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; ++j) {
            double s = 0;
            for (std::size_t p = 0; p < k; ++p) {
              const auto av =
                  static_cast<double>(ta == exec::transpose::yes ? a[p * lda + i] : a[i * lda + p]);
              const auto bv =
                  static_cast<double>(tb == exec::transpose::yes ? b[j * ldb + p] : b[p * ldb + j]);
              s += av * bv;
            }
            want[i * ldc + j] = static_cast<TestType>(static_cast<double>(alpha) * s +
                                                      static_cast<double>(beta) *
                                                          static_cast<double>(want[i * ldc + j]));
          }
        exec::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        CAPTURE(m, n, k, ta == exec::transpose::yes, tb == exec::transpose::yes);
        const double tol = std::is_same_v<TestType, float> ? 1e-5 : 1e-12;
        for (std::size_t i = 0; i < c.size(); ++i)
          REQUIRE(std::abs(static_cast<double>(c[i] - want[i])) <=
                  tol * (1 + std::abs(static_cast<double>(want[i]))));
      }
}
