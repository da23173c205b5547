// Synthesis time (A* + ratio LP rounds, heuristic included) for HAP's settings on the 64-device
// HAP testbed: BERT-base, and ViT at 6, 12, 24 and 48 layers (8 images per device, so that the
// deepest fits the testbed's 16 GiB devices).
//   build/release/bench/bench.synth
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <benchmark/benchmark.h>

#include <string>

namespace {

const hspmd::cluster& testbed() {
  static const hspmd::cluster c =
      hspmd::load_cluster(std::string(HSPMD_SOURCE_DIR) + "/clusters/hap-testbed.json");
  return c;
}

void synth_model(benchmark::State& state, const char* model, std::size_t per_device) {
  hspmd::models::model_options o;
  o.layers = static_cast<std::size_t>(state.range(0));
  const auto g = hspmd::models::trace_model<float>(model, o, per_device * testbed().size());
  std::size_t expanded = 0;
  double predicted = 0.0;
  for (auto _ : state) {
    const auto p = hspmd::synth::synthesize(g, testbed(), {}, model);
    expanded = p.stats.expanded;
    predicted = p.step_time;
    benchmark::DoNotOptimize(p.steps.data()); // (on the double itself, GCC 12 -O3 lost it)
  }
  state.counters["graph_nodes"] = static_cast<double>(g.size());
  state.counters["states_expanded"] = static_cast<double>(expanded);
  state.counters["predicted_step_s"] = predicted;
}

void bert_base(benchmark::State& state) {
  synth_model(state, "bert", 32);
}
void vit(benchmark::State& state) {
  synth_model(state, "vit", 8);
}

} // namespace

BENCHMARK(bert_base)->Arg(12)->Unit(benchmark::kMillisecond);
BENCHMARK(vit)->Arg(6)->Arg(12)->Arg(24)->Arg(48)->Unit(benchmark::kMillisecond);
