#include <hspmd/core/partition.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

using namespace hspmd;

TEST_CASE("shard_lengths: worked examples") {
  CHECK(shard_lengths(10, std::vector<double>{5, 3, 1}) == std::vector<std::size_t>{6, 3, 1});
  CHECK(shard_lengths(256, std::vector<double>{2, 1}) == std::vector<std::size_t>{171, 85});
  CHECK(shard_lengths(4, std::vector<double>{1, 1, 1}) == std::vector<std::size_t>{2, 1, 1});
  CHECK(shard_lengths(7, std::vector<double>{3, 0, 1}) == std::vector<std::size_t>{5, 0, 2});
  CHECK(shard_lengths(0, std::vector<double>{1, 2}) == std::vector<std::size_t>{0, 0});
  CHECK(shard_lengths(1, std::vector<double>{1, 1, 1}) == std::vector<std::size_t>{1, 0, 0});
  CHECK(shard_offsets(std::vector<std::size_t>{6, 3, 1}) == std::vector<std::size_t>{0, 6, 9});
}

TEST_CASE("shard_lengths: sums exactly, stays within one unit, zero ratio gives zero length") {
  std::mt19937_64 gen(12345);
  std::uniform_int_distribution<int> ranks_dist(1, 9);
  std::uniform_int_distribution<std::size_t> total_dist(0, 5000);
  std::uniform_real_distribution<double> ratio_dist(0.0, 10.0);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<double> ratios(static_cast<std::size_t>(ranks_dist(gen)));
    for (auto& r : ratios)
      r = gen() % 4 == 0 ? 0.0 : ratio_dist(gen);
    ratios[gen() % ratios.size()] += 0.5; // at least one positive ratio
    const std::size_t total = total_dist(gen);
    const auto lengths = shard_lengths(total, ratios);
    const double sum = std::accumulate(ratios.begin(), ratios.end(), 0.0);
    CAPTURE(trial, total);
    REQUIRE(lengths.size() == ratios.size());
    CHECK(std::accumulate(lengths.begin(), lengths.end(), std::size_t{0}) == total);
    for (std::size_t i = 0; i < ratios.size(); ++i) {
      const double exact = static_cast<double>(total) * ratios[i] / sum;
      CHECK(std::abs(static_cast<double>(lengths[i]) - exact) < 1.0);
      if (ratios[i] == 0.0)
        CHECK(lengths[i] == 0);
    }
    CHECK(shard_lengths(total, ratios) == lengths); // deterministic
  }
}

TEST_CASE("shard_lengths rejects ratios it cannot honour") {
  CHECK_THROWS_AS(shard_lengths(4, std::vector<double>{}), plan_error);
  CHECK_THROWS_AS(shard_lengths(4, std::vector<double>{0, 0}), plan_error);
  CHECK_THROWS_AS(shard_lengths(4, std::vector<double>{1, -1}), plan_error);
  CHECK_THROWS_AS(shard_lengths(4, std::vector<double>{1, std::nan("")}), plan_error);
  CHECK_THROWS_AS(shard_lengths(4, std::vector<double>{1, std::numeric_limits<double>::infinity()}),
                  plan_error);
}
