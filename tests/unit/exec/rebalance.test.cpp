// Boxes (exec/reshard.hpp) and the re-balancing rule (train/rebalance.hpp), without MPI.
#include <hspmd/exec/reshard.hpp>
#include <hspmd/train/rebalance.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

using namespace hspmd;
using exec::box;

TEST_CASE("boxes intersect, contain, and copy sub-boxes between row-major pieces") {
  const box a{{0, 2, 0}, {4, 3, 5}};
  const box b{{1, 0, 2}, {2, 4, 10}};
  const box i = exec::intersect(a, b);
  CHECK(i == box{{1, 2, 2}, {2, 2, 3}});
  CHECK(exec::contains(a, i));
  CHECK(exec::contains(b, i));
  CHECK_FALSE(exec::contains(i, a));
  CHECK(exec::intersect(box{{0}, {3}}, box{{3}, {2}}).empty());
  CHECK(box::whole({}).size() == 1); // a scalar holds one element

  // Pieces of a (6, 5, 4) tensor whose elements are their global indices.
  const std::vector<std::size_t> dims{6, 5, 4};
  const auto fill = [&](const box& bx) {
    std::vector<int> v;
    for (std::size_t x = 0; x < bx.length[0]; ++x)
      for (std::size_t y = 0; y < bx.length[1]; ++y)
        for (std::size_t z = 0; z < bx.length[2]; ++z)
          v.push_back(static_cast<int>(((bx.offset[0] + x) * dims[1] + bx.offset[1] + y) * dims[2] +
                                       bx.offset[2] + z));
    return v;
  };
  const box src{{1, 0, 0}, {4, 5, 4}};
  const box dst{{0, 1, 1}, {6, 3, 3}};
  const auto in = fill(src);
  std::vector<int> out(dst.size(), -1);
  const box part = exec::intersect(src, dst);
  exec::copy_box(in.data(), src, out.data(), dst, part);
  const auto want = fill(dst);
  std::size_t copied = 0;
  for (std::size_t k = 0; k < out.size(); ++k)
    if (out[k] != -1) {
      CHECK(out[k] == want[k]);
      ++copied;
    }
  CHECK(copied == part.size());
}

TEST_CASE("the straggler monitor reports factors once a device lags over a full window") {
  train::straggler_monitor m({1.25, 3, 1}, {1.0, 0.5}); // one window over the threshold suffices
  // The machine is twice as slow as modelled everywhere: no lag between devices.
  CHECK_FALSE(m.observe(std::vector<double>{9.0, 9.0})); // the warm-up step is not counted
  for (int s = 0; s < 5; ++s)
    CHECK_FALSE(m.observe(std::vector<double>{2.0, 1.0}));
  // Device 1 three times slower: reported after the window's median moves, not before.
  CHECK_FALSE(m.observe(std::vector<double>{2.0, 3.0}));
  const auto f = m.observe(std::vector<double>{2.0, 3.0});
  REQUIRE(f);
  CHECK((*f)[0] == Approx(1.0));
  CHECK((*f)[1] == Approx(3.0));
  // After a re-balance: one step uncounted, then a full window under the new predictions.
  m.restart({0.9, 0.3});
  CHECK_FALSE(m.observe(std::vector<double>{5.0, 5.0}));
  CHECK_FALSE(m.observe(std::vector<double>{1.8, 0.6}));
  CHECK_FALSE(m.observe(std::vector<double>{1.8, 0.6}));
  CHECK_FALSE(m.observe(std::vector<double>{1.8, 0.6}));
  // A device that recovers shows up as the others lagging it.
  CHECK_FALSE(m.observe(std::vector<double>{1.8, 0.2}));
  const auto back = m.observe(std::vector<double>{1.8, 0.2});
  REQUIRE(back);
  CHECK((*back)[0] == Approx(3.0));
  CHECK((*back)[1] == Approx(1.0));
}

TEST_CASE("a measured cluster divides each device's rates by its factor") {
  cluster c;
  c.devices.resize(2);
  c.devices[0].speed = 4e12;
  c.devices[0].bf16_speed = 8e12;
  c.devices[1].speed = 2e12;
  const cluster m = train::measured_cluster(c, std::vector<double>{1.0, 4.0});
  CHECK(m.devices[0].speed == 4e12);
  CHECK(m.devices[1].speed == 5e11);
  CHECK(m.devices[0].bf16_speed == 8e12);
  CHECK(m.devices[1].bf16_speed == 0.0);
}

namespace {

// Normal deviates from mt19937_64's raw outputs (which the standard fixes), by Box-Muller: the
// same sequence with every standard library.
class normal_source {
public:
  explicit normal_source(std::uint64_t seed) : g_(seed) {}
  double operator()() {
    const double u1 = (static_cast<double>(g_() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(g_() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

private:
  std::mt19937_64 g_;
};

// A job the monitor watches, as the trainer runs it: shares proportional to the modelled speeds;
// a report re-solves them at the measured speeds (model speed / factor), kept when the
// predicted step gains less than min_gain (then the monitor's baseline moves instead).
struct watched_job {
  std::vector<double> model; // modelled speed per device
  std::vector<double> shares;
  train::rebalance_options options;
  train::straggler_monitor monitor;
  std::vector<std::vector<double>> moves; // the factors of each move
  std::size_t kept = 0;

  watched_job(std::vector<double> speeds, train::rebalance_options o)
      : model(std::move(speeds)), shares(proportional(model)), options(o), monitor(o, predicted()) {
  }

  static std::vector<double> proportional(const std::vector<double>& v) {
    const double sum = std::accumulate(v.begin(), v.end(), 0.0);
    std::vector<double> s;
    for (double x : v)
      s.push_back(x / sum);
    return s;
  }
  [[nodiscard]] std::vector<double> predicted() const {
    std::vector<double> p;
    for (std::size_t d = 0; d < model.size(); ++d)
      p.push_back(shares[d] / model[d]);
    return p;
  }
  // One step at the devices' true `speeds`, each time multiplied by exp(sigma N(0,1)) and by
  // `spike` on device `spiked` (none when out of range).
  void step(const std::vector<double>& speeds, normal_source& n, double sigma,
            std::size_t spiked = 99, double spike = 1.0) {
    std::vector<double> t;
    for (std::size_t d = 0; d < speeds.size(); ++d)
      t.push_back(shares[d] / speeds[d] * std::exp(sigma * n()) * (d == spiked ? spike : 1.0));
    const auto f = monitor.observe(t);
    if (!f)
      return;
    std::vector<double> measured = model;
    for (std::size_t d = 0; d < model.size(); ++d)
      measured[d] /= (*f)[d];
    const auto next = proportional(measured);
    double before = 0.0, after = 0.0;
    for (std::size_t d = 0; d < model.size(); ++d) {
      before = std::max(before, shares[d] / measured[d]);
      after = std::max(after, next[d] / measured[d]);
    }
    if (after > before * (1.0 - options.min_gain)) {
      ++kept;
      monitor.keep(*f);
      monitor.restart(predicted());
      return;
    }
    model = measured;
    shares = next;
    moves.push_back(*f);
    monitor.restart(predicted());
    monitor.moved(*f);
  }
};

} // namespace

TEST_CASE("re-balancing ignores a noisy machine that the rule without hysteresis acts on") {
  // Three equal devices, 25 steps of log-normal noise (sigma 0.15 a step) and a 3x spike on one
  // device every 5th step; nothing really changes. 50 seeds.
  const auto moves = [](train::rebalance_options o) {
    std::size_t total = 0;
    for (std::uint64_t seed = 1; seed <= 50; ++seed) {
      watched_job job({1.0, 1.0, 1.0}, o);
      normal_source n(seed);
      for (std::size_t s = 0; s < 25; ++s)
        job.step({1.0, 1.0, 1.0}, n, 0.15, s % 5 == 4 ? s % 3 : 99, 3.0);
      total += job.moves.size();
    }
    return total;
  };
  const std::size_t bare = moves({1.25, 3, 1, 0.0}); // one window over the threshold, any gain
  const std::size_t held = moves({1.25, 3, 0, 0.05});
  INFO("moves in 50 noisy runs: " << bare << " without hysteresis, " << held << " with");
  CHECK(bare >= 50);
  CHECK(held == 0);
}

TEST_CASE("re-balancing moves once for a device that slows down, and once back when it "
          "recovers") {
  watched_job job({1.0, 1.0, 1.0}, {1.25, 3, 0, 0.05});
  normal_source n(7);
  std::vector<std::size_t> moved_after;
  for (std::size_t s = 0; s < 40; ++s) {
    const double slow = s >= 4 && s < 15 ? 4.0 : 1.0; // device 1 four times slower
    const std::size_t before = job.moves.size();
    job.step({1.0, 1.0 / slow, 1.0}, n, 0.05);
    if (job.moves.size() > before)
      moved_after.push_back(s + 1);
  }
  REQUIRE(job.moves.size() == 2);
  INFO("moves after steps " << moved_after[0] << " and " << moved_after[1]);
  // The slowdown: device 1 is the one found slow, by about 4x, within two windows.
  const auto& down = job.moves[0];
  CHECK(std::ranges::max_element(down) - down.begin() == 1);
  CHECK(down[1] == Approx(4.0).epsilon(0.15));
  CHECK(moved_after[0] <= 4 + 1 + 3 + 5); // the slowdown, a skipped step, window + persist - 1
  // The recovery: device 1 now runs ahead (its factor about 1/4), and its share goes back.
  const auto& up = job.moves[1];
  CHECK(std::ranges::min_element(up) - up.begin() == 1);
  // Undoes the first move's factor, within the noise of two medians of 5% noise.
  CHECK(up[1] * down[1] == Approx(1.0).epsilon(0.2));
  CHECK(moved_after[1] > 15);
  CHECK(job.shares[1] == Approx(1.0 / 3.0).epsilon(0.1));
}
