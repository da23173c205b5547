// Which BLAS kernels run the host GEMMs: the rule that never leaves a generic fallback on a CPU
// with wider vectors (a VM that reports its CPU generically gets OpenBLAS's SSE3 "Prescott"
// kernels), the warnings a slower choice by hand gets, and the real switch inside OpenBLAS:
// from Prescott back to the CPU's widest set, with GEMM results unchanged.
#include <hspmd/exec/backends/blas.hpp>
#include <hspmd/exec/backends/host.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

using namespace hspmd;
namespace blas = hspmd::exec::blas;

namespace {

blas::cpu_features skylake_server() {
  blas::cpu_features f;
  f.avx = f.avx2_fma = f.avx512 = true;
  return f;
}

} // namespace

TEST_CASE("kernel sets are ranked by vector width, and a CPU's widest set is named") {
  CHECK(blas::tier("Prescott") == 0);
  CHECK(blas::tier("NEHALEM") == 0);
  CHECK(blas::tier("Sandybridge") == 1);
  CHECK(blas::tier("haswell") == 2);
  CHECK(blas::tier("Zen") == 2);
  CHECK(blas::tier("SkylakeX") == 3);
  CHECK(blas::tier("Cooperlake") == 3);
  CHECK(blas::widest_core(skylake_server()) == "SkylakeX");
  auto zen4 = skylake_server();
  zen4.amd = true;
  zen4.avx512_bf16 = true;
  CHECK(blas::widest_core(zen4) == "Cooperlake");
  blas::cpu_features zen2;
  zen2.amd = zen2.avx = zen2.avx2_fma = true;
  CHECK(blas::widest_core(zen2) == "Zen");
  blas::cpu_features old;
  CHECK(blas::widest_core(old).empty());
  // AMD Zen 4: AVX-512 through 256-bit units; OpenBLAS's AVX2 kernels run faster there.
  zen4.amd_zen4 = true;
  CHECK(blas::widest_core(zen4) == "Cooperlake");
  CHECK(blas::preferred_core(zen4) == "Haswell");
  CHECK(blas::preferred_core(skylake_server()) == "SkylakeX");
}

TEST_CASE("on AMD Zen 4 the AVX2 kernels replace OpenBLAS's AVX-512 choice, unless asked") {
  blas::cpu_features zen4 = skylake_server();
  zen4.amd = zen4.avx512_bf16 = zen4.amd_zen4 = true;
  auto d = blas::decide("Cooperlake", zen4, nullptr, nullptr, true);
  CHECK(d.target == "Haswell");
  CHECK(d.warning.empty());
  CHECK_THAT(d.reason, Catch::Contains("on AMD Zen 4 its Haswell kernels are faster"));
  d = blas::decide("Prescott", zen4, nullptr, nullptr, true); // a fallback there too
  CHECK(d.target == "Haswell");
  d = blas::decide("Cooperlake", zen4, nullptr, "keep", true);
  CHECK(d.target.empty());
  CHECK(d.warning.empty()); // wider than preferred: slower here, but not a fallback
  d = blas::decide("Cooperlake", zen4, "Cooperlake", nullptr, true);
  CHECK(d.target.empty());
  CHECK(d.warning.empty());
}

TEST_CASE("a generic fallback on a wider CPU is replaced, and a right choice kept") {
  // The case found on a VM: AVX-512 CPU, OpenBLAS took Prescott, nothing set by hand.
  auto d = blas::decide("Prescott", skylake_server(), nullptr, nullptr, true);
  CHECK(d.target == "SkylakeX");
  CHECK(d.warning.empty());
  CHECK_THAT(d.reason,
             Catch::Contains("OpenBLAS took Prescott (SSE)") && Catch::Contains("AVX-512"));
  // OpenBLAS chose well: nothing to do.
  d = blas::decide("SkylakeX", skylake_server(), nullptr, nullptr, true);
  CHECK(d.target.empty());
  CHECK(d.warning.empty());
  CHECK(d.reason == "OpenBLAS's choice");
  // A BLAS that cannot switch at run time: kept, with the fix.
  d = blas::decide("Prescott", skylake_server(), nullptr, "", false);
  CHECK(d.target.empty());
  CHECK_THAT(d.warning, Catch::Contains("set OPENBLAS_CORETYPE=SkylakeX before the program"));
}

TEST_CASE("a slower kernel set chosen by hand is kept, with a warning and the fix") {
  auto d = blas::decide("Prescott", skylake_server(), "Prescott", nullptr, true);
  CHECK(d.target.empty());
  CHECK(d.reason == "OPENBLAS_CORETYPE=Prescott");
  CHECK_THAT(d.warning, Catch::Contains("unset OPENBLAS_CORETYPE (hspmd then runs SkylakeX)"));
  d = blas::decide("SkylakeX", skylake_server(), "SkylakeX", nullptr, true);
  CHECK(d.warning.empty());
  d = blas::decide("Prescott", skylake_server(), nullptr, "keep", true);
  CHECK(d.target.empty());
  CHECK_THAT(d.warning, Catch::Contains("unset HSPMD_BLAS_CORE"));
  d = blas::decide("SkylakeX", skylake_server(), nullptr, "Haswell", true);
  CHECK(d.target == "Haswell");
  CHECK_THAT(d.warning, Catch::Contains("HSPMD_BLAS_CORE=Haswell runs AVX2 kernels where "
                                        "SkylakeX's AVX-512 kernels run"));
}

namespace {

// C = A B for a few shapes through exec::gemm, against a plain triple loop in double.
double worst_gemm_error() {
  double worst = 0.0;
  for (const std::size_t n : {3U, 17U, 64U, 129U}) {
    std::vector<float> a(n * n);
    std::vector<float> b(n * n);
    std::vector<float> c(n * n);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
      b[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
    }
    exec::gemm(exec::transpose::no, exec::transpose::no, n, n, n, 1.0F, a.data(), n, b.data(), n,
               0.0F, c.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double want = 0.0;
        for (std::size_t k = 0; k < n; ++k)
          want += static_cast<double>(a[i * n + k]) * static_cast<double>(b[k * n + j]);
        worst = std::max(worst, std::abs(want - static_cast<double>(c[i * n + j])));
      }
  }
  return worst;
}

} // namespace

TEST_CASE("OpenBLAS's kernels switch at run time: from Prescott back to the CPU's widest") {
  const blas::info& first = blas::ensure();
  INFO(blas::describe(first));
  CHECK(first.threads >= 1);
  const std::string widest = blas::preferred_core(blas::detect_cpu());
  if (first.library.rfind("OpenBLAS", 0) != 0 || first.core.empty() || widest.empty() ||
      blas::tier(widest) == 0)
    SUCCEED("not an OpenBLAS with run-time kernel selection on a CPU with AVX: nothing to switch");
  else {
    CHECK(worst_gemm_error() < 1e-3);
    // What a VM that reports its CPU generically gets at load.
    REQUIRE(blas::detail::switch_core("Prescott"));
    CHECK(worst_gemm_error() < 1e-3);
    // hspmd's start-up rule, on the library as it now is (nothing set by hand).
    const char* saved = std::getenv("OPENBLAS_CORETYPE");
    const std::string saved_text = saved != nullptr ? saved : "";
    ::unsetenv("OPENBLAS_CORETYPE");
    const char* mine = std::getenv("HSPMD_BLAS_CORE");
    const std::string mine_text = mine != nullptr ? mine : "";
    ::unsetenv("HSPMD_BLAS_CORE");
    blas::info again;
    blas::detail::initialise(again);
    if (saved != nullptr)
      ::setenv("OPENBLAS_CORETYPE", saved_text.c_str(), 1);
    if (mine != nullptr)
      ::setenv("HSPMD_BLAS_CORE", mine_text.c_str(), 1);
    INFO(blas::describe(again));
    CHECK(blas::tier(again.core) == blas::tier(widest));
    CHECK_THAT(again.reason, Catch::Contains("hspmd's choice: OpenBLAS took Prescott"));
    CHECK(again.warning.empty());
    CHECK(worst_gemm_error() < 1e-3);
    // Back to what this process ran before the test.
    REQUIRE(blas::detail::switch_core(first.core));
  }
  // The start-up line names the library, the kernel set and the rate.
  const blas::info& s = blas::status();
  CHECK(s.sgemm_flops > 0.0);
  const std::string line = blas::describe(s);
  CHECK_THAT(line, Catch::StartsWith("BLAS: ") && Catch::Contains("kernels ") &&
                       Catch::Contains("GFLOP/s"));
}
