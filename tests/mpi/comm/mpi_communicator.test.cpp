// The MPI backend's collectives at every rank count the suite runs (1, 2, 3), with uneven and
// zero-length contributions. Checks use CHECK (not REQUIRE) so that every rank keeps calling the
// same collectives in the same order even after a failure.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/core/partition.hpp>

#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

using namespace hspmd;

TEST_CASE("the communicator is a duplicate of the world with the same ranks") {
  const mpi_communicator comm;
  int world_rank = -1;
  int world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  CHECK(comm.rank() == world_rank);
  CHECK(comm.size() == world_size);
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(comm.native_handle(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT); // same group, different context: our messages never mix
  comm.barrier();
}

TEMPLATE_TEST_CASE("all_reduce sum, max and min", "", float, double, std::int32_t, std::int64_t) {
  const mpi_communicator comm;
  const int n = comm.size();
  const int r = comm.rank();
  const std::vector<TestType> in{static_cast<TestType>(r + 1), static_cast<TestType>(-r),
                                 static_cast<TestType>(10 * r)};
  std::vector<TestType> out(3);
  comm.all_reduce(std::span<const TestType>(in), std::span<TestType>(out), reduce_op::sum);
  CHECK(out[0] == static_cast<TestType>(n * (n + 1) / 2));
  CHECK(out[1] == static_cast<TestType>(-n * (n - 1) / 2));
  CHECK(out[2] == static_cast<TestType>(10 * n * (n - 1) / 2));

  std::vector<TestType> inplace = in;
  comm.all_reduce(std::span<TestType>(inplace), reduce_op::max);
  CHECK(inplace[0] == static_cast<TestType>(n));
  CHECK(inplace[1] == static_cast<TestType>(0));
  CHECK(comm.all_reduce(static_cast<TestType>(r), reduce_op::min) == static_cast<TestType>(0));
  CHECK(comm.all_reduce(static_cast<TestType>(r), reduce_op::max) == static_cast<TestType>(n - 1));

  std::vector<TestType> empty_in;
  std::vector<TestType> empty_out;
  comm.all_reduce(std::span<const TestType>(empty_in), std::span<TestType>(empty_out),
                  reduce_op::sum); // zero elements is legal
}

TEST_CASE("broadcast from every root") {
  const mpi_communicator comm;
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<double> v(5, comm.rank() == root ? 1.5 * (root + 1) : -1.0);
    comm.broadcast(std::span<double>(v), root);
    CAPTURE(root);
    for (double x : v)
      CHECK(x == 1.5 * (root + 1));
  }
}

TEST_CASE("all_gather_v with uneven and zero-length contributions") {
  const mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::vector<std::vector<double>> ratio_sets = {
      std::vector<double>(n, 1.0), // even
      [&] {
        std::vector<double> v(n, 1.0);
        v[0] = 3.0;
        return v;
      }(), // 3:1(:1)
      [&] {
        std::vector<double> v{5, 3, 1};
        v.resize(n, 1.0);
        return v;
      }(),
      [&] {
        std::vector<double> v(n, 1.0);
        v[n - 1] = 0.0;
        if (n == 1)
          v[0] = 1;
        return v;
      }(),
      [&] {
        std::vector<double> v(n, 0.0);
        v[n / 2] = 1.0;
        return v;
      }(), // all on one rank
  };
  for (const std::size_t total : {0UL, 1UL, 7UL, 1000UL}) {
    for (const auto& ratios : ratio_sets) {
      const auto counts = shard_lengths(total, ratios);
      const auto offsets = shard_offsets(counts);
      std::vector<std::int64_t> mine(counts[me]);
      std::iota(mine.begin(), mine.end(), static_cast<std::int64_t>(offsets[me]));
      std::vector<std::int64_t> all(total, -1);
      comm.all_gather_v(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all),
                        std::span<const std::size_t>(counts));
      std::vector<std::int64_t> expected(total);
      std::iota(expected.begin(), expected.end(), std::int64_t{0});
      CAPTURE(total, ratios);
      CHECK(all == expected);
    }
  }
}

TEST_CASE("misuse becomes a comm_error naming the rank and the call") {
  const mpi_communicator comm;
  const std::string rank = "rank " + std::to_string(comm.rank()) + ": ";

  std::vector<double> v(2);
  // An invalid root is caught by MPI's own argument checks on every rank: no rank hangs.
  try {
    comm.broadcast(std::span<double>(v), comm.size());
    FAIL("broadcast to a root out of range did not throw");
  } catch (const comm_error& e) {
    CHECK(e.rank() == comm.rank());
    CHECK_THAT(e.what(), Catch::StartsWith(rank + "MPI_Bcast: MPI_ERR_ROOT"));
  }

  const std::vector<std::size_t> wrong_counts(static_cast<std::size_t>(comm.size()) + 1, 0);
  std::vector<double> out;
  CHECK_THROWS_WITH(comm.all_gather_v(std::span<const double>(), std::span<double>(out),
                                      std::span<const std::size_t>(wrong_counts)),
                    Catch::StartsWith(rank + "all_gather_v: " + std::to_string(comm.size() + 1) +
                                      " counts for "));
  std::vector<double> a(2);
  std::vector<double> b(3);
  CHECK_THROWS_AS(comm.all_reduce(std::span<const double>(a), std::span<double>(b), reduce_op::sum),
                  comm_error);
  comm.barrier(); // every rank is still in step
}
