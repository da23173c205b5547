// The library trainer's distributed run on a device engine (train/distributed_engine.hpp): a
// device-like backend (the guarded one: its pages are PROT_NONE outside its calls) registered
// with a distributed engine, as hspmd::cuda registers CUDA over NCCL, trains every rank equal
// to the host run of the same plan: accumulation, clipping, Adam, evaluation and trainer::value.
// "auto" takes only an engine that every rank can use.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/train/distributed_engine.hpp>
#include <hspmd/train/trainer.hpp>

#include "../../support/deferred_backend.hpp"
#include "../../support/guarded_backend.hpp"
#include "../../support/test_cluster.hpp"
#include "../../support/training.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

using entry = train::device_engine_entry<float, exec::adam>;

int measured = 0; // calls of the engines' `measure` in this process

entry guarded_entry(std::string name, bool only_rank0) {
  entry e;
  e.name = std::move(name);
  e.probe = [only_rank0](std::string& why) {
    if (only_rank0 && mpi_communicator().rank() != 0) {
      why = "this rank has none";
      return 0;
    }
    return 1;
  };
  const std::string label = e.name + " (guarded memory)";
  e.make = [label](const graph::graph& g, std::uint64_t seed) {
    return std::unique_ptr<train::engine<float, exec::adam>>(
        std::make_unique<train::backend_engine<float, exec::adam, test::guarded_backend>>(
            g, seed, test::guarded_backend{}, label));
  };
  e.make_distributed = [label](const graph::graph& g, const synth::plan& p, mpi_communicator& comm,
                               std::uint64_t seed) {
    return std::unique_ptr<train::rank_engine<float, exec::adam>>(
        std::make_unique<
            train::distributed_engine<float, exec::adam, mpi_communicator, test::guarded_backend>>(
            g, p, comm, seed, test::guarded_backend{}, label));
  };
  // Calibration on the "device": timed through an asynchronous backend, as on a GPU's stream.
  e.measure = [](const graph::graph& g, double speed, const train::profile_options& o) {
    ++measured;
    return train::measure_compute<float, test::deferred_backend>(g, speed, o);
  };
  return e;
}
// "some" has a device on rank 0 only: "auto" must pass it over on 2 or more ranks.
const train::register_device_engine<float, exec::adam> some{guarded_entry("some", true)};
const train::register_device_engine<float, exec::adam> guarded{guarded_entry("guarded", false)};

void model(nn::tracer& t) {
  auto x = t.input<float, extents<hspmd::batch, 6>>("x");
  auto y = t.input<std::int64_t, extents<hspmd::batch>>("y");
  auto h = nn::dropout(nn::gelu(nn::linear<float, 6, 16>{"fc1"}(t, x)), 0.25);
  h = nn::layer_norm<float, 16>{"norm"}(t, h);
  t.set_loss(nn::cross_entropy(nn::linear<float, 16, 4>{"fc2"}(t, h), y));
}

void samples(exec::batch_sink<float>& b, std::size_t index) {
  std::vector<float> x;
  std::vector<std::int64_t> y;
  for (std::size_t k = index * 10; k < (index + 1) * 10; ++k) {
    float s = 0.0F;
    for (std::size_t f = 0; f < 6; ++f) {
      x.push_back(static_cast<float>((k * 37 + f * 11) % 97) / 48.0F - 1.0F);
      s += x.back() * (static_cast<float>(f) - 2.0F);
    }
    y.push_back(s > 1.0F ? 0 : (s > 0.0F ? 1 : (s > -1.0F ? 2 : 3)));
  }
  b.set_input("x", x);
  b.set_input("y", y);
}

train::train_options options(const std::string& device, const std::string& plan) {
  train::train_options o = test_support::quiet_training(5, 3e-2, 0.5);
  o.batch = 10;
  o.accumulate = 2;
  o.eval_every = 5;
  o.device = device;
  o.plan = plan;
  const auto n = static_cast<std::size_t>(mpi_communicator().size());
  std::vector<double> speeds;
  for (std::size_t d = 0; d < n; ++d)
    speeds.push_back(1e9 * static_cast<double>(n - d));
  o.cluster_spec = test::make_cluster(speeds, 1e6);
  return o;
}

} // namespace

TEST_CASE("every rank on a device engine trains as the host run of the same plan") {
  for (const std::string plan : {"synth", "dp-cp", "tp"}) {
    INFO(plan);
    train::trainer<float> host(model, options("host", plan));
    train::trainer<float> dev(model, options("guarded", plan));
    CHECK(host.device() == "host");
    CHECK(dev.device() == "guarded (guarded memory)");
    const auto a = host.fit(samples, samples);
    const auto b = dev.fit(samples, samples);
    REQUIRE(a.losses.size() == b.losses.size());
    for (std::size_t s = 0; s < a.losses.size(); ++s)
      CHECK(b.losses[s] == Approx(a.losses[s]).epsilon(1e-5));
    REQUIRE(b.evals.size() == 1);
    CHECK(b.evals[0].loss == Approx(a.evals[0].loss).epsilon(1e-5));
    CHECK(b.evals[0].accuracy == a.evals[0].accuracy);
    for (const char* p : {"fc1.weight", "norm.gamma", "fc2.bias"}) {
      const auto wa = host.value(p);
      const auto wb = dev.value(p);
      REQUIRE(wa.size() == wb.size());
      for (std::size_t i = 0; i < wa.size(); ++i)
        CHECK(wb[i] == Approx(wa[i]).epsilon(1e-4).margin(1e-6));
    }
    CHECK_THROWS_WITH(dev.local(), Catch::Contains("trainer::local()"));
  }
}

TEST_CASE("auto takes a device engine only when every rank has a device for it") {
  // "some" is registered first but has a device on rank 0 only.
  train::trainer<float> tr(model, options("auto", "dp-cp"));
  CHECK(tr.device() == "guarded (guarded memory)");
}

TEST_CASE("--calibrate measures rank 0's compute on its device engine") {
  train::train_options o = options("guarded", "synth");
  o.calibrate = true;
  const int before = measured;
  train::trainer<float> tr(model, o);
  // The model at its batch and at half of it (each op's fixed share), on rank 0's engine.
  CHECK(measured - before == (mpi_communicator().rank() == 0 ? 2 : 0));
  const auto r = tr.fit(samples, samples);
  CHECK(r.losses.size() == 5);
  CHECK(std::isfinite(r.losses.back()));
}
