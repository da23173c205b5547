// The library trainer on a device engine (train/engine.hpp): the loop, micro-batch accumulation,
// clipping, the optimizer, evaluation and reading parameters all go through the engine's
// backend, so a backend whose memory the host cannot touch outside its calls (as a GPU's) trains
// as the host does. The engine is registered the way hspmd::cuda registers "cuda"; choosing a
// device by name, "auto", and the errors of a missing or unusable device are checked too.
#include <hspmd/exec/optim.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/trainer.hpp>

#include "../../support/guarded_backend.hpp"
#include "../../support/training.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

using engine_entry = train::device_engine_entry<float, exec::adam>;

const train::register_device_engine<float, exec::adam> absent{engine_entry{
    "absent",
    [](std::string& why) {
      why = "no such card";
      return 0;
    },
    [](const graph::graph&, std::uint64_t) -> std::unique_ptr<train::engine<float, exec::adam>> {
      FAIL("an engine without a device was made");
      return nullptr;
    },
    {},   // one process only
    {}}}; // calibrated on the host
const train::register_device_engine<float, exec::adam> guarded{engine_entry{
    "guarded",
    [](std::string&) { return 1; },
    [](const graph::graph& g, std::uint64_t seed) {
      return std::unique_ptr<train::engine<float, exec::adam>>(
          std::make_unique<train::backend_engine<float, exec::adam, test::guarded_backend>>(g,
                                                                                            seed));
    },
    {},   // one process only
    {}}}; // calibrated on the host

// Linear, GELU, dropout, layer norm, linear, cross-entropy: a kernel of each kind the loop uses.
void model(nn::tracer& t) {
  auto x = t.input<float, extents<hspmd::batch, 6>>("x");
  auto y = t.input<std::int64_t, extents<hspmd::batch>>("y");
  auto h = nn::dropout(nn::gelu(nn::linear<float, 6, 16>{"fc1"}(t, x)), 0.25);
  h = nn::layer_norm<float, 16>{"norm"}(t, h);
  t.set_loss(nn::cross_entropy(nn::linear<float, 16, 4>{"fc2"}(t, h), y));
}

exec::feed_fn<float> device_samples(std::size_t batch) {
  return [batch](exec::batch_sink<float>& b, std::size_t index) {
    std::vector<float> x;
    std::vector<std::int64_t> y;
    for (std::size_t k = index * batch; k < (index + 1) * batch; ++k) {
      std::mt19937_64 rng(k + 3);
      std::normal_distribution<float> nd(0.0F, 1.0F);
      float s = 0.0F;
      for (int f = 0; f < 6; ++f) {
        x.push_back(nd(rng));
        s += x.back() * static_cast<float>(f - 2);
      }
      y.push_back(s > 1.0F ? 0 : (s > 0.0F ? 1 : (s > -1.0F ? 2 : 3)));
    }
    b.set_input("x", x);
    b.set_input("y", y);
  };
}

train::train_options options(const std::string& device) {
  train::train_options o = test_support::quiet_training(6, 3e-2, 0.5); // clipping is active
  o.batch = 8;
  o.accumulate = 2;
  o.eval_every = 3;
  o.eval_batches = 2;
  o.device = device;
  return o;
}

} // namespace

TEST_CASE("the trainer on a device engine trains as on the host: losses, evaluations, weights") {
  train::trainer<float> host(model, options("host"));
  train::trainer<float> dev(model, options("guarded"));
  CHECK(host.device() == "host");
  CHECK(dev.device() == "guarded host memory");
  const auto a = host.fit(device_samples(8), device_samples(8));
  const auto b = dev.fit(device_samples(8), device_samples(8));
  REQUIRE(a.losses.size() == 6);
  REQUIRE(b.losses.size() == 6);
  // Equal to rounding: the gradient norm's reduction runs in chunks on a device.
  for (std::size_t s = 0; s < 6; ++s)
    CHECK(b.losses[s] == Approx(a.losses[s]).epsilon(1e-5));
  CHECK(a.losses.back() < a.losses.front());
  REQUIRE(a.evals.size() == 2);
  REQUIRE(b.evals.size() == 2);
  for (std::size_t e = 0; e < 2; ++e) {
    CHECK(b.evals[e].loss == Approx(a.evals[e].loss).epsilon(1e-5));
    CHECK(b.evals[e].accuracy == a.evals[e].accuracy);
  }
  for (const char* p : {"fc1.weight", "fc1.bias", "norm.gamma", "fc2.weight"}) {
    const auto wa = host.value(p);
    const auto wb = dev.value(p);
    REQUIRE(wa.size() == wb.size());
    for (std::size_t i = 0; i < wa.size(); ++i)
      CHECK(wb[i] == Approx(wa[i]).epsilon(1e-4).margin(1e-6));
  }
  // The host executor of the host trainer holds the same values trainer::value reads.
  const auto& ex = host.local();
  const auto w = ex.value(ex.parameter("fc1.weight"));
  CHECK(std::vector<float>(w.begin(), w.end()) == host.value("fc1.weight"));
  CHECK_THROWS_WITH(dev.local(), Catch::Contains("trainer::local()") &&
                                     Catch::Contains("guarded host memory") &&
                                     Catch::Contains("trainer::value(name)"));
  CHECK_THROWS_WITH(dev.value("fc9.weight"), Catch::Contains("names no floating-point node"));
  CHECK_THROWS_WITH(dev.value("y"), Catch::Contains("names no floating-point node"));
}

TEST_CASE("choosing the device: by name, auto, and one line when it cannot be had") {
  // "auto" takes the first registered engine that finds a device ("absent" finds none).
  CHECK(train::trainer<float>(model, options("auto")).device() == "guarded host memory");
  CHECK(train::trainer<float>(model, options("host")).device() == "host");
  train::train_options defaults;
  defaults.out = nullptr;
  CHECK(train::trainer<float>(model, defaults).device() == "host"); // the default
  // Registered for float with Adam only: a trainer of doubles has no "guarded" engine.
  train::train_options d = options("guarded");
  CHECK_THROWS_WITH(train::trainer<double>(
                        [](nn::tracer& t) {
                          auto x = t.input<double, extents<hspmd::batch, 2>>("x");
                          t.set_loss(nn::sum(nn::linear<double, 2, 1>{"fc"}(t, x)));
                        },
                        d),
                    Catch::Contains("device guarded: is not a device this program knows "
                                    "(host, auto)"));
  CHECK_THROWS_WITH(train::trainer<float>(model, options("absent")),
                    Catch::Contains("device absent: no usable device: no such card") &&
                        Catch::Contains("give device host"));
  CHECK_THROWS_WITH(train::trainer<float>(model, options("tpu")),
                    Catch::Contains("device tpu: is not a device this program knows (host, auto, "
                                    "absent, guarded)"));
  // This test program does not link hspmd::cuda: the error says what to link.
  CHECK_THROWS_WITH(train::trainer<float>(model, options("cuda")),
                    Catch::Contains("not linked with hspmd::cuda") &&
                        Catch::Contains("link hspmd::cuda into the program"));
  // An engine registered without a distributed one is refused with a cluster (before MPI).
  train::train_options c = options("guarded");
  c.cluster = "clusters/emulated-2.json";
  CHECK_THROWS_WITH(train::trainer<float>(model, c),
                    Catch::Contains("device guarded: trains one process only"));
}
