// Start-up costs of the foundation: reading a large cluster file, rounding ratios to shard
// lengths, materializing a parameter slice from the counter-based RNG.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/partition.hpp>
#include <hspmd/core/tensor_ops.hpp>

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace {

void parse_hap_testbed(benchmark::State& state) {
  const std::string text =
      hspmd::io::read_text_file(std::string(HSPMD_SOURCE_DIR) + "/clusters/hap-testbed.json");
  for (auto _ : state)
    benchmark::DoNotOptimize(hspmd::parse_cluster(text, "hap-testbed.json"));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(text.size()));
}
BENCHMARK(parse_hap_testbed);

void fingerprint_hap_testbed(benchmark::State& state) {
  const auto c = hspmd::load_cluster(std::string(HSPMD_SOURCE_DIR) + "/clusters/hap-testbed.json");
  for (auto _ : state)
    benchmark::DoNotOptimize(hspmd::fingerprint(c));
}
BENCHMARK(fingerprint_hap_testbed);

void shard_lengths(benchmark::State& state) {
  std::vector<double> ratios(static_cast<std::size_t>(state.range(0)));
  for (std::size_t i = 0; i < ratios.size(); ++i)
    ratios[i] = 1.0 + static_cast<double>(i % 7);
  for (auto _ : state)
    benchmark::DoNotOptimize(hspmd::shard_lengths(1'000'003, ratios));
}
BENCHMARK(shard_lengths)->Arg(2)->Arg(64)->Arg(1024);

// One rank's slice (1/8 of the rows) of a (4096, 1024) f32 parameter, N(0, 0.02^2).
void fill_normal_slice(benchmark::State& state) {
  hspmd::tensor<float, hspmd::extents<hspmd::dynamic_extent, 1024>> part(512);
  for (auto _ : state) {
    hspmd::fill_normal(part, {1, 3}, 0.02, 0, 1024, 4096);
    benchmark::DoNotOptimize(part.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(part.size()));
}
BENCHMARK(fill_normal_slice);

} // namespace
