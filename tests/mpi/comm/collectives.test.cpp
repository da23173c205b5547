// Every collective of the MPI backend x every algorithm x element type (f32, f64, i32) x split
// pattern (even, 3:1, 5:3:1, 1:0:1 with an empty shard, all on one rank) x total size, against
// a serial reference computed locally from the same deterministic inputs: exact for integers
// and for data movement, within 1e-6 of the sum of magnitudes for floating-point sums.
// Checks use CHECK (not REQUIRE) so every rank keeps calling the same collectives after a
// failure. Run at np 1, 2, 3 and 4 (oversubscribed), and at np 3 with HSPMD_DEBUG=detail.
#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/core/partition.hpp>
#include <hspmd/core/rng.hpp>

#include <catch2/catch.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

using namespace hspmd;

static_assert(communicator<mpi_communicator, float>);
static_assert(communicator<mpi_communicator, std::int32_t>);

namespace {

struct pattern {
  std::string name;
  std::vector<double> ratios;
};

// The split patterns of the issue, for n ranks (extra ranks get ratio 1; fewer ranks truncate).
std::vector<pattern> patterns(std::size_t n) {
  const auto fit = [n](std::vector<double> v, double fill) {
    v.resize(n, fill);
    if (std::all_of(v.begin(), v.end(), [](double r) { return r == 0.0; }))
      v[0] = 1.0;
    return v;
  };
  std::vector<double> one_hot(n, 0.0);
  one_hot[n / 2] = 1.0;
  return {{"even", std::vector<double>(n, 1.0)},
          {"3:1", fit({3, 1}, 1)},
          {"5:3:1", fit({5, 3, 1}, 1)},
          {"1:0:1", fit({1, 0, 1}, 1)},
          {"all on one rank", one_hot}};
}

constexpr std::size_t totals[] = {0, 1, 7, 1000, 4099};
constexpr uneven_algorithm algorithms[] = {uneven_algorithm::automatic, uneven_algorithm::padded,
                                           uneven_algorithm::grouped, uneven_algorithm::native};

// The value rank r contributes at index i: exactly reproducible on every rank.
template <class T>
T value(std::size_t r, std::size_t i) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::int64_t>((r * 7919 + i * 31) % 2001) - 1000);
  else
    return static_cast<T>(2.0 * uniform01({99, r}, i) - 1.0);
}

template <class T>
T reduce(T a, T b, reduce_op op) {
  switch (op) {
  case reduce_op::max:
    return std::max(a, b);
  case reduce_op::min:
    return std::min(a, b);
  case reduce_op::sum:
    break;
  }
  return static_cast<T>(a + b);
}

// op over ranks of value(r, i), and the sum of magnitudes (the scale of rounding errors).
template <class T>
std::pair<T, double> reference(std::size_t ranks, std::size_t i, reduce_op op) {
  T acc = value<T>(0, i);
  double magnitude = std::abs(static_cast<double>(acc));
  for (std::size_t r = 1; r < ranks; ++r) {
    acc = reduce(acc, value<T>(r, i), op);
    magnitude += std::abs(static_cast<double>(value<T>(r, i)));
  }
  return {acc, magnitude};
}

template <class T>
bool close(T got, T want, double magnitude) {
  if constexpr (std::is_integral_v<T>)
    return got == want;
  else
    return std::abs(static_cast<double>(got) - static_cast<double>(want)) <= 1e-6 * magnitude;
}

constexpr reduce_op reductions[] = {reduce_op::sum, reduce_op::max, reduce_op::min};

} // namespace

TEMPLATE_TEST_CASE("all_gather_v: every algorithm and split, out of place and in place", "", float,
                   double, std::int32_t) {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  for (const auto& p : patterns(n))
    for (std::size_t total : totals)
      for (uneven_algorithm alg : algorithms) {
        const auto counts = shard_lengths(total, p.ratios);
        const auto offsets = shard_offsets(counts);
        std::vector<TestType> mine(counts[me]);
        for (std::size_t i = 0; i < mine.size(); ++i)
          mine[i] = value<TestType>(me, offsets[me] + i);
        std::vector<TestType> want(total);
        for (std::size_t r = 0; r < n; ++r)
          for (std::size_t i = 0; i < counts[r]; ++i)
            want[offsets[r] + i] = value<TestType>(r, offsets[r] + i);

        std::vector<TestType> out(total, TestType{-7});
        comm.all_gather_v(std::span<const TestType>(mine), std::span<TestType>(out), counts, alg);
        std::vector<TestType> inplace(total, TestType{-7});
        std::copy(mine.begin(), mine.end(),
                  inplace.begin() + static_cast<std::ptrdiff_t>(offsets[me]));
        comm.all_gather_v(std::span<TestType>(inplace), counts, alg);
        CAPTURE(p.name, total, name(alg));
        CHECK(out == want);
        CHECK(inplace == want);
      }
}

TEMPLATE_TEST_CASE(
    "reduce_scatter_v: every algorithm, split and reduction, out of place and in place", "", float,
    double, std::int32_t) {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  for (const auto& p : patterns(n))
    for (std::size_t total : totals)
      for (uneven_algorithm alg : algorithms)
        for (reduce_op op : reductions) {
          const auto counts = shard_lengths(total, p.ratios);
          const auto offsets = shard_offsets(counts);
          std::vector<TestType> in(total);
          for (std::size_t i = 0; i < total; ++i)
            in[i] = value<TestType>(me, i);
          std::vector<TestType> out(counts[me], TestType{-7});
          comm.reduce_scatter_v(std::span<const TestType>(in), std::span<TestType>(out), counts, op,
                                alg);
          std::vector<TestType> inplace = in;
          comm.reduce_scatter_v(std::span<TestType>(inplace), counts, op, alg);
          bool ok = true;
          for (std::size_t i = 0; i < out.size(); ++i) {
            const auto [want, magnitude] = reference<TestType>(n, offsets[me] + i, op);
            ok = ok && close(out[i], want, magnitude) &&
                 close(inplace[offsets[me] + i], want, magnitude);
          }
          // In-place reduce-scatter then in-place all-gather is an all-reduce.
          comm.all_gather_v(std::span<TestType>(inplace), counts, alg);
          for (std::size_t i = 0; i < total; ++i) {
            const auto [want, magnitude] = reference<TestType>(n, i, op);
            ok = ok && close(inplace[i], want, magnitude);
          }
          CAPTURE(p.name, total, name(alg), name(op));
          CHECK(ok);
        }
}

TEMPLATE_TEST_CASE("all_reduce and broadcast", "", float, double, std::int32_t) {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  for (std::size_t size : totals) {
    for (reduce_op op : reductions) {
      std::vector<TestType> in(size);
      for (std::size_t i = 0; i < size; ++i)
        in[i] = value<TestType>(me, i);
      std::vector<TestType> out(size);
      comm.all_reduce(std::span<const TestType>(in), std::span<TestType>(out), op);
      comm.all_reduce(std::span<TestType>(in), op); // in place
      bool ok = true;
      for (std::size_t i = 0; i < size; ++i) {
        const auto [want, magnitude] = reference<TestType>(n, i, op);
        ok = ok && close(out[i], want, magnitude) && in[i] == out[i];
      }
      CAPTURE(size, name(op));
      CHECK(ok);
    }
    for (std::size_t root = 0; root < n; ++root) {
      std::vector<TestType> buf(size, TestType{-7});
      if (root == me)
        for (std::size_t i = 0; i < size; ++i)
          buf[i] = value<TestType>(root, i);
      comm.broadcast(std::span<TestType>(buf), static_cast<int>(root));
      bool ok = true;
      for (std::size_t i = 0; i < size; ++i)
        ok = ok && buf[i] == value<TestType>(root, i);
      CAPTURE(size, root);
      CHECK(ok);
    }
  }
}

TEMPLATE_TEST_CASE("all_to_all_v with uneven and empty messages", "", float, double, std::int32_t) {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  for (std::size_t scale : {0UL, 1UL, 13UL}) {
    // Rank r sends (r + 2 s) % 3 * scale elements to rank s: some messages are empty.
    const auto amount = [scale](std::size_t r, std::size_t s) { return (r + 2 * s) % 3 * scale; };
    std::vector<std::size_t> send_counts(n);
    std::vector<std::size_t> recv_counts(n);
    for (std::size_t s = 0; s < n; ++s) {
      send_counts[s] = amount(me, s);
      recv_counts[s] = amount(s, me);
    }
    std::vector<TestType> in;
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t i = 0; i < send_counts[s]; ++i)
        in.push_back(value<TestType>(me, s * 1000 + i));
    std::vector<TestType> out(std::accumulate(recv_counts.begin(), recv_counts.end(), 0UL));
    comm.all_to_all_v(std::span<const TestType>(in), send_counts, std::span<TestType>(out),
                      recv_counts);
    std::vector<TestType> want;
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t i = 0; i < recv_counts[r]; ++i)
        want.push_back(value<TestType>(r, me * 1000 + i));
    CAPTURE(scale);
    CHECK(out == want);
  }
}

TEST_CASE("under Open MPI the non-blocking all-reduce runs the ring unless the user chose") {
#if defined(OPEN_MPI) && OPEN_MPI
  // tests/support/mpi_main.cpp applies prefer_mpi_settings() before MPI_Init, as
  // hspmd::mpi_environment does; a value set in the environment by hand stays.
  const std::optional<int> alg = mpi_control_variable("coll_libnbc_iallreduce_algorithm");
  REQUIRE(alg.has_value());
  const char* set = std::getenv(libnbc_iallreduce_variable);
  REQUIRE(set != nullptr);
  CHECK(*alg == std::stoi(set));
  CHECK(!mpi_control_variable("no_such_variable_anywhere").has_value());
#else
  SUCCEED("not Open MPI: nothing is preferred");
#endif
}

TEST_CASE("send and recv around a ring, and barrier") {
  mpi_communicator comm;
  const int n = comm.size();
  const int me = comm.rank();
  if (n > 1) {
    std::vector<double> mine(5, me + 0.5);
    std::vector<double> got(5);
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    if (me % 2 == 0) {
      comm.send(std::span<const double>(mine), next, 7);
      comm.recv(std::span<double>(got), prev, 7);
    } else {
      comm.recv(std::span<double>(got), prev, 7);
      comm.send(std::span<const double>(mine), next, 7);
    }
    CHECK(got == std::vector<double>(5, prev + 0.5));
  }
  comm.barrier();
}

TEST_CASE("the communicator is a congruent duplicate of the world") {
  mpi_communicator comm;
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(comm.native_handle(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT); // same group, different context: our messages never mix
}

TEST_CASE("misuse becomes a comm_error naming the rank and the call, on every rank") {
  mpi_communicator comm;
  const std::string rank = "rank " + std::to_string(comm.rank()) + ": ";
  std::vector<double> v(2);
  try { // an invalid root is caught by MPI's own argument checks on every rank
    comm.broadcast(std::span<double>(v), comm.size());
    FAIL("broadcast to a root out of range did not throw");
  } catch (const comm_error& e) {
    CHECK(e.rank() == comm.rank());
    CHECK_THAT(e.what(), Catch::StartsWith(rank + "MPI_Bcast: MPI_ERR_ROOT"));
  }
  const std::vector<std::size_t> wrong_counts(static_cast<std::size_t>(comm.size()) + 1, 0);
  std::vector<double> out;
  CHECK_THROWS_WITH(
      comm.all_gather_v(std::span<const double>(), std::span<double>(out), wrong_counts),
      Catch::StartsWith(rank + "all_gather_v: " + std::to_string(comm.size() + 1) +
                        " counts for "));
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), 2);
  std::vector<double> small(1);
  std::vector<double> whole(2 * counts.size());
  CHECK_THROWS_WITH(comm.reduce_scatter_v(std::span<const double>(whole), std::span<double>(small),
                                          counts, reduce_op::sum),
                    Catch::StartsWith(rank + "reduce_scatter_v: buffer sizes"));
  std::vector<double> a(2);
  std::vector<double> b(3);
  CHECK_THROWS_AS(comm.all_reduce(std::span<const double>(a), std::span<double>(b), reduce_op::sum),
                  comm_error);
  comm.barrier(); // every rank is still in step
}
