// hspmd demo (`make demo`): BERT-small trained on a mixed cluster with the plan hspmd
// synthesizes, next to even data parallelism (DP-EV), both through the library trainer.
//
//   mpirun -np 2 build/release/examples/demo            # the built-in 2-rank cluster
//   mpirun -np 3 build/release/examples/demo --cluster clusters/emulated-3.json
//
// Every rank traces the model and synthesizes the plan (the ranks then check that they agree on
// cluster, ratios and plan before any training collective). Each plan trains the same model from
// the same seed on the same batches; rank 1 of the built-in cluster is emulated as two times
// slower (its compute is stretched by busy-waiting). The demo prints the plan, the losses and
// measured step times of both runs, and the speedup.

#include "train.hpp"

#include <hspmd/hspmd.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace {

// The built-in default cluster (clusters/emulated-2.json): two CPU ranks, rank 1 two times slower.
constexpr const char* builtin_cluster = R"({
  "version": 1, "name": "emulated-2",
  "description": "Two CPU ranks on one machine; rank 1 is emulated as two times slower (its compute is stretched 2x).",
  "links": {"intra_node": {"bandwidth": 5e9, "latency": 1e-6}},
  "devices": [
    {"name": "cpu0", "kind": "cpu", "speed": 5e10, "memory": "4 GiB", "node": 0},
    {"name": "cpu1", "kind": "cpu", "speed": 2.5e10, "memory": "4 GiB", "node": 0, "slowdown": 2}
  ]
})";

int run(int argc, char** argv) {
  CLI::App app{"hspmd demo: BERT-small on a mixed cluster, synthesized plan vs even data "
               "parallelism"};
  std::string cluster_file;
  hspmd::train::train_options o;
  o.steps = 8;
  o.batch = 16;
  o.unit = "tokens";
  o.log_every = 1;
  hspmd::models::model_options m;
  m.layers = 2;
  m.hidden = 256;
  m.heads = 2;
  m.seq = 64;
  m.vocab = 2000;
  app.add_option("--cluster", cluster_file,
                 "cluster file, one device per rank (default: the built-in emulated-2, rank 1 "
                 "two times slower)");
  app.add_option("--steps", o.steps, "training steps per plan")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{2}, std::size_t{10000}));
  app.add_option("--batch", o.batch, "sequences per step")
      ->capture_default_str()
      ->check(hspmd::train::at_least_one);
  app.add_option("--layers", m.layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", m.hidden, "model width")->capture_default_str();
  if (const auto rc = hspmd::exec::parse_flags(app, argc, argv))
    return *rc;

  if (cluster_file.empty())
    o.cluster_spec = hspmd::parse_cluster(builtin_cluster, "<built-in emulated-2>");
  else
    o.cluster = cluster_file;
  o.units_per_sample = m.seq;
  const auto g = hspmd::models::trace_model<float>("bert", m, o.batch);
  example::markov_text text(m.vocab, 1); // the same batches on every rank and for every plan
  const auto feed = [&](example::sink& s, std::size_t i) {
    std::vector<std::int64_t> tokens, targets;
    text.batch(i, o.batch, m.seq, tokens, targets);
    s.set_input("tokens", tokens);
    s.set_input("targets", targets);
  };

  hspmd::train::train_result result[2];
  double predicted[2] = {0.0, 0.0};
  bool root = false;
  for (int k = 0; k < 2; ++k) {
    o.plan = k == 0 ? "synth" : "dp-ev";
    o.name = k == 0 ? "synth" : "dp-ev";
    hspmd::train::trainer<float> tr(g, o);
    root = tr.root();
    if (root && k == 0) {
      const auto& p = *tr.plan();
      std::size_t collectives = 0;
      std::size_t sfb = 0;
      for (const auto& st : p.steps)
        for (const auto& t : st.transfers) {
          collectives += t.kind != hspmd::synth::transfer_kind::load &&
                         t.kind != hspmd::synth::transfer_kind::slice &&
                         t.kind != hspmd::synth::transfer_kind::to_partial;
          sfb += t.sfb;
        }
      std::printf("  synthesized plan: %zu ops, %zu collectives, %zu weight gradients by SFB, "
                  "%zu A* states\n\n",
                  p.steps.size(), collectives, sfb, p.stats.expanded);
    }
    result[k] = tr.fit(feed);
    predicted[k] = result[k].predicted_step_seconds;
    if (root)
      std::printf("\n");
  }

  double worst = 0.0; // the two plans compute the same training run
  for (std::size_t s = 0; s < o.steps; ++s)
    worst = std::max(worst, std::abs(result[0].losses[s] - result[1].losses[s]) /
                                std::abs(result[1].losses[s]));
  const double ta = result[0].median_step_seconds();
  const double tb = result[1].median_step_seconds();
  if (root) {
    std::printf("  plan    measured step (median)  predicted  loss after %zu steps\n", o.steps);
    std::printf("  synth   %8.1f ms              %7.1f ms  %.4f\n", 1e3 * ta, 1e3 * predicted[0],
                result[0].losses.back());
    std::printf("  DP-EV   %8.1f ms              %7.1f ms  %.4f\n", 1e3 * tb, 1e3 * predicted[1],
                result[1].losses.back());
    std::printf("\n  -> the synthesized plan is %.2fx faster than DP-EV; both runs give the same "
                "losses (largest relative difference %.1e)\n",
                tb / ta, worst);
  }
  return worst < 1e-3 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([&] { return run(argc, argv); });
}
