// Everything the executor and the optimizers do to a tensor goes through the backend: run on a
// backend whose memory the host cannot touch outside backend calls, as with a GPU, training
// gives what the host backend gives. The guarded backend keeps every buffer in pages of its own
// and leaves them PROT_NONE except while one of its calls runs, so a host read or write of a
// "device" buffer anywhere else (a loss read, a parameter initialized in place, an optimizer
// state on the host) ends the test with a segmentation fault at that line instead of passing
// silently where a GPU would have failed. The deferred backend runs its kernels only when
// something waits for them, as a device's stream does, so a read that does not wait sees stale
// values; both train under bf16 too (rounding kernels and 16-bit GEMMs' scratch operands).
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/mlp.hpp>

#include "../../support/deferred_backend.hpp"
#include "../../support/guarded_backend.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

using namespace hspmd;

namespace {

using test::guarded_backend;

// Trains `steps` Adam steps with clipping on the host and on backend `Device` from the same seed
// and data, in precision `prec`; compares the losses and the final parameters.
template <class Device = guarded_backend, class Feed>
void same_training(const graph::graph& g, Feed feed, int steps, double clip, bool exact,
                   exec::precision prec = exec::precision::f32) {
  exec::executor<float> host(g, 5);
  exec::executor<float, Device> guarded(g, 5);
  host.set_precision(prec);
  guarded.set_precision(prec);
  exec::adam host_opt(1e-2);
  exec::adam guarded_opt(1e-2);
  for (int s = 0; s < steps; ++s) {
    feed(host, s);
    feed(guarded, s);
    const float lh = host.forward();
    const float lg = guarded.forward();
    host.backward();
    guarded.backward();
    const double nh = exec::clip_grad_norm(host, clip);
    const double ng = exec::clip_grad_norm(guarded, clip);
    host_opt.step(host);
    guarded_opt.step(guarded);
    if (exact) {
      REQUIRE(lg == lh);
    } else {
      REQUIRE(lg == Approx(lh).epsilon(1e-5));
    }
    // The norm is reduced in another order off the host: equal to rounding.
    REQUIRE(ng == Approx(nh).epsilon(1e-12));
  }
  for (graph::node_id p : g.parameters()) {
    const std::vector<float> want(host.value(p).begin(), host.value(p).end());
    const std::vector<float> got = guarded.value_to_host(p);
    REQUIRE(got.size() == want.size());
    if (exact) {
      REQUIRE(got == want);
    } else {
      for (std::size_t i = 0; i < got.size(); ++i)
        REQUIRE(got[i] == Approx(want[i]).margin(1e-5));
    }
    const std::vector<float> grad = guarded.grad_to_host(p);
    REQUIRE(grad.size() == want.size());
  }
  if constexpr (std::is_same_v<Device, guarded_backend>)
    CHECK(guarded.backend().calls() > 0);
}

} // namespace

TEST_CASE("an MLP trains through a backend whose memory the host cannot touch") {
  models::mlp_config cfg;
  cfg.inputs = 12;
  cfg.hidden = {16, 8};
  cfg.classes = 4;
  const graph::graph g = models::trace_mlp<float>(cfg, 6);
  std::normal_distribution<float> n01;
  std::vector<float> x(6 * 12);
  std::vector<std::int64_t> y(6);
  auto feed = [&](auto& ex, int step) {
    std::mt19937 r(static_cast<unsigned>(step));
    for (float& v : x)
      v = n01(r);
    for (auto& v : y)
      v = static_cast<std::int64_t>(r() % 4);
    ex.set_input("x", std::span<const float>(x));
    ex.set_input("labels", std::span<const std::int64_t>(y));
  };
  SECTION("without clipping: bit for bit") {
    same_training(g, feed, 3, 0.0, true);
  }
  SECTION("with clipping: to rounding") {
    same_training(g, feed, 3, 0.05, false);
  }
  SECTION("asynchronous, bit for bit") {
    same_training<test::deferred_backend>(g, feed, 3, 0.0, true);
  }
  SECTION("bf16, guarded and asynchronous") {
    same_training(g, feed, 3, 0.0, true, exec::precision::bf16);
    same_training<test::deferred_backend>(g, feed, 3, 0.05, false, exec::precision::bf16);
  }
}

TEST_CASE("a BERT trains through a backend whose memory the host cannot touch") {
  models::bert_config cfg;
  cfg.layers = 1;
  cfg.hidden = 16;
  cfg.heads = 2;
  cfg.ffn = 32;
  cfg.vocab = 23;
  cfg.seq = 5;
  const graph::graph g = models::trace_bert_lm<float>(cfg, 3);
  std::vector<std::int64_t> ids(3 * 5), labels(3 * 5);
  auto feed = [&](auto& ex, int step) {
    std::mt19937 r(static_cast<unsigned>(step) + 100);
    for (auto& v : ids)
      v = static_cast<std::int64_t>(r() % 23);
    for (auto& v : labels)
      v = static_cast<std::int64_t>(r() % 23);
    ex.set_input("tokens", std::span<const std::int64_t>(ids));
    ex.set_input("targets", std::span<const std::int64_t>(labels));
  };
  same_training(g, feed, 2, 0.0, true);
  same_training<test::deferred_backend>(g, feed, 2, 0.05, false, exec::precision::bf16);
}
