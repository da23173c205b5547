// hspmd-profile: measure the cluster an MPI job runs on and write it as a cluster file the
// planner reads as is (train/cluster_profile.hpp says what is measured and how).
//   mpirun -np 2 hspmd-profile --out measured.json
//   mpirun -np 2 hspmd-profile --merge clusters/emulated-2.json --out emulated-2-measured.json
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>
#include <hspmd/io/cli.hpp>
#include <hspmd/train/cluster_profile.hpp>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace {

// The host's available memory (MemAvailable of /proc/meminfo), in bytes; 0 when unknown.
std::uint64_t available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:")
      return kib * 1024;
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  CLI::App app{"hspmd-profile: measure each rank's device, the links and the collectives of this "
               "MPI job, and write a cluster file (docs/cluster-file.md)"};
  std::string out = "cluster-measured.json";
  std::string merge_file;
  std::string name;
  app.add_option("--out", out, "the cluster file to write (rank 0)")->capture_default_str();
  app.add_option("--merge", merge_file,
                 "a hand-written cluster file: keep its names, kinds, nodes, slowdowns and 16-bit "
                 "rates, fill in the measured speeds, memory, links and collectives");
  app.add_option("--name", name, "the cluster's name (default: the merged file's, or measured)");
  int repetitions = 3;
  app.add_option("--repetitions", repetitions, "timed runs per measurement, after a warm-up")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  if (const auto rc = hspmd::io::parse_flags(app, argc, argv))
    return *rc;
  return hspmd::run_guarded([&] {
    hspmd::mpi_communicator comm;
    comm.set_timeout(hspmd::timeout_from_env(hspmd::default_training_timeout));
    std::optional<hspmd::cluster> merge;
    if (!merge_file.empty())
      merge = hspmd::load_cluster(merge_file);
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0)
      std::snprintf(host, sizeof host, "unknown");
    // This rank's share of its node's memory.
    const auto node_ranks = [&] {
      MPI_Comm local = MPI_COMM_NULL;
      MPI_Comm_split_type(comm.native_handle(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
      int size = 1;
      MPI_Comm_size(local, &size);
      MPI_Comm_free(&local);
      return static_cast<std::uint64_t>(size);
    }();
    const std::uint64_t memory = available_memory() / node_ranks;
    std::vector<hspmd::train::device_measurement> measured;
    hspmd::cluster c =
        hspmd::train::measure_cluster(comm, host, memory, merge, &measured, repetitions);
    if (!name.empty())
      c.name = name;
    // What the planner will read: checked by the reader's own rules before it is written.
    const std::string text = hspmd::to_json(c).dump(2);
    (void)hspmd::parse_cluster(text, out);
    if (comm.rank() == 0) {
      std::ofstream f(out);
      f << text << "\n";
      if (!f)
        throw hspmd::config_error(out, "cannot be written",
                                  "give a path in an existing, writable directory");
      // Rates in GF/s: the probe step's (speed) and its op classes' (what the cost model
      // uses), then 512^3 GEMMs alone, as measured (before any emulated slowdown).
      std::printf("%-10s %-6s %4s %8s %8s %8s %8s %8s %9s %9s %10s\n", "device", "kind", "node",
                  "speed", "gemm", "elemwise", "softmax", "optim", "GEMM f32", "GEMM f64",
                  "memory");
      for (std::size_t r = 0; r < c.size(); ++r) {
        const auto& d = c.devices[r];
        const auto& m = measured[r];
        std::printf("%-10s %-6s %4lld %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %6.1f GiB\n",
                    d.name.c_str(), d.kind.c_str(), static_cast<long long>(d.node),
                    m.training_speed / 1e9, m.rates[0] / 1e9, m.rates[1] / 1e9, m.rates[2] / 1e9,
                    m.rates[3] / 1e9, m.gemm_f32 / 1e9, m.gemm_f64 / 1e9,
                    static_cast<double>(d.memory) / 1073741824.0);
      }
      for (const auto& d : c.devices) // the MFU peak the file records, and what ran it
        std::printf("%s: peak %.2f GF/s (%s)\n", d.name.c_str(), d.peak / 1e9, d.blas.c_str());
      std::printf("intra-node link: %.2f GB/s, latency %.2f us", c.intra_node.bandwidth / 1e9,
                  c.intra_node.latency * 1e6);
      if (c.inter_node)
        std::printf("; inter-node: %.2f GB/s, latency %.2f us", c.inter_node->bandwidth / 1e9,
                    c.inter_node->latency * 1e6);
      std::printf("\ncollectives calibrated; %.0f%% of an all-reduce hidden behind compute\n"
                  "wrote %s (%zu devices on %lld node(s))\n",
                  100.0 * c.overlap, out.c_str(), c.size(),
                  static_cast<long long>(c.devices.back().node + 1));
    }
    return 0;
  });
}
