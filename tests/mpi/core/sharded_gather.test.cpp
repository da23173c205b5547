// Typed tensors across ranks: each rank materializes only its uneven slice of a seeded tensor,
// computes on it, and one all_gather_v reassembles results identical to a single-process run.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/core/sharded.hpp>
#include <hspmd/core/tensor_ops.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace hspmd;

namespace {
// Elements per rank of a row-split (rows x cols) matrix.
std::vector<std::size_t> element_counts(const std::vector<std::size_t>& rows, std::size_t cols) {
  std::vector<std::size_t> c;
  for (std::size_t r : rows)
    c.push_back(r * cols);
  return c;
}
} // namespace

TEST_CASE("a data-parallel linear layer on uneven shards equals the single-process result") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const std::vector<std::vector<double>> ratio_sets = {
      std::vector<double>(n, 1.0),
      [&] {
        std::vector<double> v{3, 1, 1};
        v.resize(n);
        return v;
      }(),
      [&] {
        std::vector<double> v{5, 3, 1};
        v.resize(n);
        return v;
      }(),
      [&] {
        std::vector<double> v{0, 1, 2};
        v.resize(n);
        if (n == 1)
          v[0] = 1;
        return v;
      }(),
  };
  constexpr std::size_t rows = 37;
  using X = sharded<double, extents<batch, 16>, split<0>>;
  tensor<double, extents<16, 8>> w;
  fill_normal(w, rng_key{7, 1}, 0.1); // replicated: every rank draws the same weights
  tensor<double, extents<batch, 16>> x_whole(rows);
  fill_normal(x_whole, rng_key{7, 0}, 1.0);
  const auto y_whole = matmul(x_whole, w);

  for (const auto& ratios : ratio_sets) {
    auto x = X::zeros(extents<batch, 16>(rows), ratios, static_cast<std::size_t>(comm.rank()));
    x.fill_normal(rng_key{7, 0}, 1.0);
    const auto y_local = matmul(x.local(), w); // (b_r, 8)
    const auto counts = element_counts(shard_lengths(rows, ratios), 8);
    tensor<double, extents<batch, 8>> y(rows);
    comm.all_gather_v(std::span<const double>(y_local.values()), y.values(),
                      std::span<const std::size_t>(counts));
    CAPTURE(ratios);
    CHECK(y == y_whole); // bit for bit: each row is summed in the same order everywhere
  }
}

TEST_CASE("ranks agree on the parsed cluster through its fingerprint") {
  mpi_communicator comm;
  const cluster c = load_cluster(std::string(HSPMD_SOURCE_DIR) + "/clusters/hap-testbed.json");
  const std::uint64_t fp = fingerprint(c);
  CHECK(comm.all_reduce(fp, reduce_op::min) == fp);
  CHECK(comm.all_reduce(fp, reduce_op::max) == fp);
}
