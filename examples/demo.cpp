// hspmd demo: a data-parallel linear layer y = x W on uneven shards of a mixed cluster.
//
//   mpirun -np 2 build/release/examples/demo --cluster clusters/emulated-2.json
//
// Each rank reads the cluster file, the ranks check that they parsed the same cluster, and
// each takes a share of the batch proportional to its device's speed. A rank materializes only
// its rows of x (from the counter-based RNG, by global index), computes its rows of y, and one
// uneven all_gather_v assembles y everywhere; the result is checked bit for bit against a
// single-process computation. Finally the compute step is timed with an even split and with the
// speed-weighted split, with each device's slowdown emulated by busy-waiting.

#include <hspmd/hspmd.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::size_t features = 256;
constexpr std::size_t outputs = 128;
using x_extents = hspmd::extents<hspmd::batch, features>;
using x_shard = hspmd::sharded<float, x_extents, hspmd::split<0>>;
using w_tensor = hspmd::tensor<float, hspmd::extents<features, outputs>>;

// Emulation of a slower device on a CPU: stretch `seconds` of work by `slowdown` by spinning.
void emulate_slowdown(double seconds, double slowdown) {
  const auto until = clock_type::now() + std::chrono::duration<double>(seconds * (slowdown - 1.0));
  while (clock_type::now() < until) {
  }
}

// Seconds of this rank's step: its rows of y = x W with the slowdown emulated (best of 3).
double timed_step(hspmd::mpi_communicator& comm, std::size_t rows,
                  const std::vector<double>& ratios, const w_tensor& w, double slowdown) {
  auto x = x_shard::zeros(x_extents(rows), ratios, static_cast<std::size_t>(comm.rank()));
  x.fill_normal({1, 0}, 1.0);
  double best = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    comm.barrier();
    const auto start = clock_type::now();
    const auto y = hspmd::matmul(x.local(), w);
    const double compute = std::chrono::duration<double>(clock_type::now() - start).count();
    emulate_slowdown(compute, slowdown);
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - start).count());
    if (y.size() == 1) // keep the product alive
      std::printf(" ");
  }
  return best;
}

int run(int argc, char** argv) {
  CLI::App app{"hspmd demo: a data-parallel linear layer on uneven shards of a mixed cluster"};
  std::string cluster_file = HSPMD_DEFAULT_CLUSTER;
  std::size_t rows = 4096;
  app.add_option("--cluster", cluster_file, "cluster file (one device per rank)")
      ->capture_default_str();
  app.add_option("--batch", rows, "rows of x (the batch)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  hspmd::mpi_communicator comm;
  const bool root = comm.rank() == 0;
  const hspmd::cluster cluster = hspmd::load_cluster(cluster_file);
  hspmd::check_rank_count(cluster, static_cast<std::size_t>(comm.size()));

  // Every rank must work from the same cluster: compare fingerprints before any real work.
  const std::uint64_t fp = hspmd::fingerprint(cluster);
  if (comm.all_reduce(fp, hspmd::reduce_op::min) != fp ||
      comm.all_reduce(fp, hspmd::reduce_op::max) != fp)
    throw hspmd::config_error(cluster_file, "ranks read different cluster files",
                              "give every rank the same file");

  // Speed-weighted shares of the batch (the synthesizer will refine these with its LP).
  std::vector<double> ratios;
  for (const auto& d : cluster.devices)
    ratios.push_back(d.speed);
  const auto lengths = hspmd::shard_lengths(rows, ratios);
  const auto me = static_cast<std::size_t>(comm.rank());

  if (root) {
    std::printf("hspmd demo: a data-parallel linear layer y = x W on %d MPI ranks\n", comm.size());
    std::printf("cluster \"%s\" (%s)\n", cluster.name.c_str(), cluster_file.c_str());
    if (!cluster.description.empty())
      std::printf("  %s\n", cluster.description.c_str());
    std::printf("\n  rank  device      speed (flop/s)  slowdown  rows of x (batch %zu)\n", rows);
    for (std::size_t r = 0; r < cluster.size(); ++r) {
      const auto& d = cluster.devices[r];
      std::printf("  %-4zu  %-10s  %14.3g  %7.3gx  %5zu (%4.1f%%)\n", r, d.name.c_str(), d.speed,
                  d.slowdown, lengths[r],
                  100.0 * static_cast<double>(lengths[r]) / static_cast<double>(rows));
    }
    std::printf("\n");
  }

  // 1. Each rank materializes only its rows of x; W is replicated (same seed on every rank).
  w_tensor w;
  hspmd::fill_normal(w, {1, 1}, 1.0 / 16.0);
  auto x = x_shard::zeros(x_extents(rows), ratios, me);
  x.fill_normal({1, 0}, 1.0);
  // 2. Local compute on the shard: (b_r, 256) x (256, 128) -> (b_r, 128).
  const auto y_local = hspmd::matmul(x.local(), w);
  // 3. One uneven all_gather_v assembles y on every rank.
  std::vector<std::size_t> counts;
  for (std::size_t len : lengths)
    counts.push_back(len * outputs);
  hspmd::tensor<float, hspmd::extents<hspmd::batch, outputs>> y(rows);
  comm.all_gather_v(std::span<const float>(y_local.values()), y.values(),
                    std::span<const std::size_t>(counts));
  // 4. Check against the single-process computation, on every rank.
  hspmd::tensor<float, x_extents> x_whole(rows);
  hspmd::fill_normal(x_whole, {1, 0}, 1.0);
  const bool same = y == hspmd::matmul(x_whole, w);
  const bool all_same = comm.all_reduce(same ? 1 : 0, hspmd::reduce_op::min) == 1;

  if (root) {
    std::printf("  1. each rank drew only its rows of x (seeded counter-based RNG, by global "
                "index) and all of W\n");
    std::printf("  2. each rank computed its rows of y = x W: (b_r, %zu) x (%zu, %zu)\n", features,
                features, outputs);
    std::printf("  3. all_gather_v with uneven counts (");
    for (std::size_t r = 0; r < counts.size(); ++r)
      std::printf("%s%zu", r == 0 ? "" : " + ", counts[r]);
    std::printf(" floats) assembled y %s on every rank\n", y.shape().to_string().c_str());
    std::printf("  4. y %s the single-process result bit for bit on every rank\n",
                all_same ? "equals" : "DIFFERS FROM");
    std::printf("     ranks agree on the cluster (fingerprint %016llx)\n\n",
                static_cast<unsigned long long>(fp));
  }

  // 5. Why uneven shares: time the step with an even split and with the speed-weighted one.
  const double slowdown = cluster.devices[me].slowdown;
  const std::vector<double> even(cluster.size(), 1.0);
  std::vector<double> t_even(cluster.size());
  std::vector<double> t_weighted(cluster.size());
  const double mine_even = timed_step(comm, rows, even, w, slowdown);
  const double mine_weighted = timed_step(comm, rows, ratios, w, slowdown);
  comm.all_gather_v(std::span<const double>(&mine_even, 1), std::span<double>(t_even),
                    std::vector<std::size_t>(cluster.size(), 1));
  comm.all_gather_v(std::span<const double>(&mine_weighted, 1), std::span<double>(t_weighted),
                    std::vector<std::size_t>(cluster.size(), 1));
  if (root) {
    const double step_even = *std::max_element(t_even.begin(), t_even.end());
    const double step_weighted = *std::max_element(t_weighted.begin(), t_weighted.end());
    std::printf("  5. compute time of one step per rank (slowdowns emulated by busy-waiting):\n");
    std::printf("     %-15s", "");
    for (std::size_t r = 0; r < cluster.size(); ++r)
      std::printf("  rank %-4zu", r);
    std::printf("  step (slowest rank)\n");
    const auto row = [&](const char* label, const std::vector<double>& t, double step) {
      std::printf("     %-15s", label);
      for (double s : t)
        std::printf("  %6.1f ms", 1e3 * s);
      std::printf("  %6.1f ms\n", 1e3 * step);
    };
    row("even split", t_even, step_even);
    row("speed-weighted", t_weighted, step_weighted);
    std::printf("     -> the speed-weighted split is %.2fx faster than the even split\n",
                step_even / step_weighted);
    std::printf("\nNext: the synthesizer will choose splits and collectives for whole models "
                "(see docs/).\n");
  }
  return all_same ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([&] { return run(argc, argv); });
}
