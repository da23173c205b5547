#include <hspmd/exec/backends/host.hpp>
#include <hspmd/kernels/activation.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <numbers>
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

// GELU in float takes Phi and the density from one `math::normal_tail` at |x| clamped to 13, and
// Phi is erfc(-x/sqrt 2)/2 so that its lower tail keeps its digits (1 + erf rounded it to 0 below
// x = -5.4, an error of 3 % in the derivative there). Reference in double: x Phi(x) and Phi(x) +
// x phi(x); the derivative's error is measured against the sum of the two terms' magnitudes (they
// cancel near x = -0.75). Measured: the forward within 4.1e-7 relative (6.5 ulp), the derivative
// within 0.8 of its bound.
TEST_CASE("GELU and its derivative are accurate over a dense sweep and at the limits", "") {
  const hspmd::exec::gelu_math<float> gelu;
  double worst = 0;
  float worst_at = 0;
  const auto check = [&](float x) {
    const float y = gelu.forward(x);
    const float dx = gelu.backward(x, y, 1.0f);
    const double xd = x;
    const double cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    const double y_ref = xd * cdf;
    if (std::fabs(y_ref) > 1e-36) // normal floats: relative (8 ulp)
      CHECK(std::fabs(static_cast<double>(y) - y_ref) <= 5e-7 * std::fabs(y_ref));
    else // below: 0 to float precision
      CHECK(std::fabs(y) <= 1e-36f);
    const double density = std::exp(-0.5 * xd * xd) / std::sqrt(2.0 * std::numbers::pi);
    const double scale = cdf + std::fabs(xd) * density;
    if (scale < 1e-30) { // both terms below any float's resolution: the result must be ~0
      REQUIRE(std::fabs(dx) < 1e-30f);
      return;
    }
    // erfc's bounds (core/fastmath.hpp) at x / sqrt 2: a few float ulps near 0, 16 ulp below 4,
    // relative 1e-4 out to its underflow
    const double ax = std::fabs(xd) / std::sqrt(2.0);
    const double bound = ax < 0.921875 ? 4e-7 : ax < 4 ? 2e-6 : 1e-4;
    const double err = std::fabs(static_cast<double>(dx) - (cdf + xd * density)) / scale / bound;
    if (!(err <= worst)) {
      worst = err;
      worst_at = x;
    }
  };
  for (float x = -20.0f; x <= 20.0f; x += 1.0f / 4096.0f)
    check(x);
  for (const float x : {0.0f, -0.0f, 1e-38f, -1e-38f, 1e-31f, 1e-29f, -1e-29f, 1e-7f, -1e-7f})
    check(x);
  INFO("worst error " << worst << " of its bound at x = " << worst_at);
  CHECK(worst <= 1);
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(gelu.forward(inf) == inf);
  CHECK(std::fabs(gelu.forward(-inf)) <= 1e-36f);
  CHECK(gelu.backward(inf, inf, 2.0f) == 2.0f);
  CHECK(std::fabs(gelu.backward(-inf, 0.0f, 2.0f)) <= 1e-30f);
  for (const float nan :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    CHECK(std::isnan(gelu.forward(nan)));
    CHECK(std::isnan(gelu.backward(nan, nan, 1.0f)));
  }
}

TEST_CASE("host buffers of 2 MiB or more start on a 2 MiB boundary (huge pages), all are zeroed") {
  const hspmd::exec::host_backend host;
  constexpr std::size_t huge = std::size_t{2} << 20;
  const auto big = host.allocate<float>(huge / sizeof(float) + 3); // a little over 2 MiB
  REQUIRE(big.size() == huge / sizeof(float) + 3);
  CHECK(reinterpret_cast<std::uintptr_t>(big.data()) % huge == 0);
  CHECK(std::all_of(big.begin(), big.end(), [](float v) { return v == 0.0F; }));
  const auto small = host.allocate<double>(1000);
  CHECK(std::all_of(small.begin(), small.end(), [](double v) { return v == 0.0; }));
  auto copy = big; // copies and moves keep the allocator's blocks consistent
  copy.back() = 1.0F;
  auto moved = std::move(copy);
  CHECK(moved.back() == 1.0F);
  CHECK(big.back() == 0.0F);
  hspmd::exec::host_allocator<double> a;
  CHECK_THROWS_AS((void)a.allocate(SIZE_MAX / 4), std::bad_array_new_length);
}
