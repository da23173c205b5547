// Every op of the registry on an asynchronous backend (kernels run only when waited for, as on a
// device's stream) against the host, in f32 and bf16: the harness the GPU suite runs with the
// CUDA backend (tests/gpu/cuda_backend.test.cu, f32 to 1e-5 and bf16 to 2e-2), and here the
// proof that no op's kernels read a buffer before the work that writes it has run.
#include <hspmd/kernels/precision.hpp>

#include "../../support/deferred_backend.hpp"
#include "../../support/op_by_op.hpp"

#include <catch2/catch.hpp>

using namespace hspmd;

TEST_CASE("every op on an asynchronous backend equals the host, in f32 and bf16") {
  for (exec::precision p : {exec::precision::f32, exec::precision::bf16}) {
    INFO(exec::name(p));
    const auto diffs =
        test::compare_every_op<test::deferred_backend>([] { return test::deferred_backend{}; }, p);
    CHECK(diffs.size() >= 80); // values and input gradients of every example call
    for (const auto& d : diffs) {
      INFO(d.what);
      CHECK(d.error == 0.0); // the same kernels in the same order: bit for bit
    }
  }
}
