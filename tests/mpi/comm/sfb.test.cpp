// Sufficient-factor broadcasting equals the all-reduce of per-rank partial gradients, for
// every split pattern (incl. empty shards) and algorithm, on every rank.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/sfb.hpp>
#include <hspmd/core/partition.hpp>
#include <hspmd/core/rng.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

using namespace hspmd;

TEMPLATE_TEST_CASE("SFB weight gradient equals the all-reduce of partial gradients", "", float,
                   double, std::int32_t) {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  constexpr std::size_t m = 9;
  constexpr std::size_t k = 5;
  const auto draw = [](std::uint64_t stream, std::size_t i) {
    if constexpr (std::is_integral_v<TestType>)
      return static_cast<TestType>(static_cast<int>(uniform01({5, stream}, i) * 21.0) - 10);
    else
      return static_cast<TestType>(2.0 * uniform01({5, stream}, i) - 1.0);
  };
  std::vector<std::vector<double>> splits = {std::vector<double>(n, 1.0),
                                             std::vector<double>(n, 0.0)};
  splits[1][n - 1] = 1.0; // all rows on the last rank, empty shards elsewhere
  if (n > 1)
    splits.push_back([&] {
      std::vector<double> v(n, 1.0);
      v[0] = 3.0;
      v[1] = 0.0;
      return v;
    }());
  for (const auto& ratios : splits)
    for (uneven_algorithm alg : {uneven_algorithm::automatic, uneven_algorithm::padded,
                                 uneven_algorithm::grouped, uneven_algorithm::native}) {
      const auto rows = shard_lengths(37, ratios);
      const auto offsets = shard_offsets(rows);
      std::vector<TestType> x(rows[me] * m);
      std::vector<TestType> dy(rows[me] * k);
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = draw(1, offsets[me] * m + i); // global indices: the batch is one tensor
      for (std::size_t i = 0; i < dy.size(); ++i)
        dy[i] = draw(2, offsets[me] * k + i);

      std::vector<TestType> sfb(m * k);
      sfb_weight_gradient(comm, std::span<const TestType>(x), std::span<const TestType>(dy), rows,
                          m, k, std::span<TestType>(sfb), alg);

      std::vector<TestType> partial(m * k, TestType{});
      std::vector<double> magnitude(m * k, 0.0);
      for (std::size_t b = 0; b < rows[me]; ++b)
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < k; ++j) {
            partial[i * k + j] += x[b * m + i] * dy[b * k + j];
            magnitude[i * k + j] += std::abs(static_cast<double>(x[b * m + i] * dy[b * k + j]));
          }
      comm.all_reduce(std::span<TestType>(partial), reduce_op::sum);
      comm.all_reduce(std::span<double>(magnitude), reduce_op::sum);
      bool ok = true;
      for (std::size_t i = 0; i < m * k; ++i) {
        if constexpr (std::is_integral_v<TestType>)
          ok = ok && sfb[i] == partial[i];
        else
          ok = ok && std::abs(static_cast<double>(sfb[i] - partial[i])) <= 1e-6 * magnitude[i];
      }
      CAPTURE(ratios, name(alg));
      CHECK(ok);
    }
}
