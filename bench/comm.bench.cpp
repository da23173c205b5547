// Hot paths of the communication layer, under mpirun (rank 0 reports):
//   mpirun -np 2 build/release/bench/bench.comm
// Collective benchmarks run a fixed number of iterations so every rank makes the same calls.
#include <hspmd/comm/debug.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/partition.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <memory>
#include <vector>

namespace {

hspmd::mpi_communicator* comm = nullptr;

// What `automatic` costs per call: three estimates over the counts of 64 ranks.
void choose_64_ranks(benchmark::State& state) {
  const auto model = hspmd::collective_cost_model::from_link(64, 1e-5, 1.3e9);
  std::vector<double> ratios(64, 1.0);
  ratios[0] = 1.8;
  const auto counts = hspmd::shard_lengths(1 << 24, ratios);
  for (auto _ : state)
    benchmark::DoNotOptimize(model.choose(hspmd::collective::all_gather_v, counts, 4));
}
BENCHMARK(choose_64_ranks);

// The debug fingerprint's hash of 64 counts (paid only with HSPMD_DEBUG=detail).
void hash_counts_64(benchmark::State& state) {
  const std::vector<std::size_t> counts(64, 12345);
  for (auto _ : state)
    benchmark::DoNotOptimize(hspmd::hash_counts(counts));
}
BENCHMARK(hash_counts_64);

// Latency of an 8-byte all-reduce: hspmd's wrapper, then MPI directly on the same communicator.
void all_reduce_8B_hspmd(benchmark::State& state) {
  double x = 1.0;
  for (auto _ : state)
    benchmark::DoNotOptimize(comm->all_reduce(x, hspmd::reduce_op::sum));
}
BENCHMARK(all_reduce_8B_hspmd)->Iterations(20000);

void all_reduce_8B_mpi(benchmark::State& state) {
  double x = 1.0;
  double y = 0.0;
  for (auto _ : state) {
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, comm->native_handle());
    benchmark::DoNotOptimize(y);
  }
}
BENCHMARK(all_reduce_8B_mpi)->Iterations(20000);

// A 64 KiB all-gather split 3:1 with each algorithm (arg: 1 padded, 2 grouped, 3 native).
void all_gather_v_64KiB(benchmark::State& state) {
  const auto alg = static_cast<hspmd::uneven_algorithm>(state.range(0));
  std::vector<double> ratios(static_cast<std::size_t>(comm->size()), 1.0);
  ratios[0] = 3.0;
  const auto counts = hspmd::shard_lengths(16384, ratios);
  std::vector<float> mine(counts[static_cast<std::size_t>(comm->rank())], 1.0F);
  std::vector<float> all(16384);
  for (auto _ : state)
    comm->all_gather_v(std::span<const float>(mine), std::span<float>(all), counts, alg);
  state.SetBytesProcessed(state.iterations() * 16384 * 4);
  state.SetLabel(std::string(hspmd::name(alg)));
}
BENCHMARK(all_gather_v_64KiB)->Arg(1)->Arg(2)->Arg(3)->Iterations(5000);

class silent_reporter : public benchmark::BenchmarkReporter {
public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    hspmd::mpi_communicator c;
    comm = &c;
    benchmark::Initialize(&argc, argv);
    if (c.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      silent_reporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    comm = nullptr;
  }
  MPI_Finalize();
  return 0;
}
