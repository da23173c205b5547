// Boxes (exec/reshard.hpp) and the re-balancing rule (train/rebalance.hpp), without MPI.
#include <hspmd/exec/reshard.hpp>
#include <hspmd/train/rebalance.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <numeric>
#include <optional>
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
  train::straggler_monitor m({1.25, 3}, {1.0, 0.5});
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
