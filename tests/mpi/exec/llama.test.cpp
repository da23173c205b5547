// Llama-small trains under mpirun like the single process, for every plan and ratio vector
// (tests/support/equivalence.hpp), f32 and f64; with fused attention in f64; with recomputed
// blocks; with grouped-query attention (8 heads, 2 key/value heads) through products and fused.
#include <hspmd/models/llama.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/hierarchical.hpp>

#include "../../support/equivalence.hpp"
#include "../../support/hierarchical_run.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace hspmd;
using namespace hspmd::test;

namespace {

// Llama-small: 2 blocks, hidden 16, 2 heads, SwiGLU 24, 6 tokens, vocabulary 40.
models::llama_config small() {
  models::llama_config c;
  c.layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 24;
  c.seq = 6;
  c.vocab = 40;
  return c;
}

} // namespace

TEST_CASE("Llama-small: distributed training equals the single process (f32, f64)") {
  models::llama_config c = small();
  // No biases; the plans must still split the bias-free projections both ways, rotate split
  // sequences and heads, and take the vocabulary apart.
  const std::vector<std::string> must = {"all_gather", "reduce_scatter", "matmul:split->partial",
                                         "vocab-parallel", "load+sfb"};
  equivalence<float>("llama", models::trace_llama_lm<float>(c, 4), 40, 1e-5, 1e6, must);
  equivalence<double>("llama", models::trace_llama_lm<double>(c, 4), 40, 1e-10, 1e6, must);
}

TEST_CASE("Llama-small with fused attention: distributed training equals the single process") {
  // At 3 ranks only (uneven ratios and a zero-length shard); the 2-rank run adds no path the
  // attention op takes and 10 s of the suite's time.
  if (mpi_communicator().size() != 3)
    return;
  models::llama_config c = small();
  c.fused_attention = true;
  // The attention op splits by heads or batch (TP, DP) and its key and value gradients come back
  // partial where the queries are split.
  equivalence<double>("llama-fused", models::trace_llama_lm<double>(c, 4), 40, 1e-10, 1e6,
                      {"attention:split", "all_gather", "reduce_scatter", "vocab-parallel"});
}

TEST_CASE("Llama-small with grouped-query attention: distributed training equals the single "
          "process") {
  // 8 query heads of 2 features share 2 key/value heads: a split along the heads divides both
  // in whole groups (4 query heads with their key/value head), at even and uneven ratios --
  // through products at 2 ranks, the fused op at 3 (3 steps, not the harness's 6: every step
  // takes the same paths; the suite's time).
  const auto n = static_cast<std::size_t>(mpi_communicator().size());
  models::llama_config c = small();
  c.heads = 8;
  c.kv_heads = 2;
  c.fused_attention = n != 2;
  const graph::graph g = models::trace_llama_lm<float>(c, 4);
  // Tensor parallelism splits the attention by heads: the key/value heads with their groups.
  const synth::plan tp =
      synth::make_baseline(g, make_cluster(n, 1e6), synth::baseline::tp, {}, "llama-gqa");
  std::size_t by_heads = 0;
  for (const synth::plan_step& st : tp.steps)
    if (c.fused_attention && st.kind == graph::op::attention &&
        st.rule.in[1] == placement::split_along(1) && st.rule.in[0] == placement::split_along(1))
      ++by_heads;
  CHECK(by_heads == (c.fused_attention ? c.layers : 0));
  if (c.fused_attention)
    equivalence<float>("llama-gqa-fused", g, 40, 1e-5, 1e6,
                       {"attention:split", "all_gather", "reduce_scatter", "vocab-parallel"}, 3);
  else
    equivalence<float>("llama-gqa", g, 40, 1e-5, 1e6,
                       {"broadcast:split", "all_gather", "reduce_scatter", "vocab-parallel"}, 3);
}

TEST_CASE("Llama-small with grouped-query attention under a two-level plan (a rank a node) "
          "trains equal to the single process") {
  // Each rank its own node: the node level alone (uneven rows by speed, every parameter
  // replicated across nodes, gradients all-reduced between them), through products at 2 ranks
  // and the fused op at 3 (3 steps, as above). Two nodes of two ranks: mpi.hierarchical.
  mpi_communicator world;
  const auto n = static_cast<std::size_t>(world.size());
  models::model_options o;
  o.layers = 2;
  o.hidden = 16;
  o.heads = 8;
  o.kv_heads = 2;
  o.ffn = 24;
  o.seq = 6;
  o.vocab = 40;
  o.fused_attention = n != 2;
  const auto trace = [&](std::size_t rows) { return models::trace_model<float>("llama", o, rows); };
  const graph::graph whole = trace(6);
  cluster c = make_cluster(n, 1e9);
  for (std::size_t d = 0; d < n; ++d) {
    c.devices[d].speed = static_cast<double>(n - d) * 1e9; // the first node fastest
    c.devices[d].node = static_cast<std::int64_t>(d);
  }
  c.inter_node = link_spec{2.5e8, 1e-5};
  synth::hierarchical_options ho;
  ho.node_search_expansions = 3000;
  const synth::hierarchical_plan p = synth::synthesize_hierarchical(trace, 6, c, ho, "llama-gqa");
  REQUIRE(p.nodes.size() == n);
  CHECK(p.node_batch.front() >= p.node_batch.back());
  const graph::graph mine = trace(p.node_batch[static_cast<std::size_t>(world.rank())]);
  check_same(run_two_level<float>(mine, whole, p, world, 40, 3), single<float>(whole, 40, 3), 1e-5,
             "llama-gqa " + p.strategy + " on " + std::to_string(n) + " nodes of one device");
}

TEST_CASE("Llama-small with recomputed blocks: distributed training equals the single process") {
  // Each block's forward runs again in the backward, its transfers included (TP's collectives,
  // FSDP's gathers made again), and SFB's layer inputs are kept for after the backward. At 2
  // ranks, even and 3:1, f64.
  mpi_communicator comm;
  if (comm.size() != 2)
    return;
  models::llama_config c = small();
  c.fused_attention = true;
  const graph::graph g = models::trace_llama_lm<double>(c, 4);
  const auto want = single<double>(g, 40, default_steps);
  const cluster cl = make_cluster(2, 1e6);
  const synth::plan dp_cp = synth::make_baseline(g, cl, synth::baseline::dp_cp, {}, "llama");
  for (const synth::plan& base : {synth::make_baseline(g, cl, synth::baseline::tp, {}, "llama"),
                                  fsdp_of(g, dp_cp), sfb_of(g, dp_cp)})
    for (const std::vector<double>& r : {std::vector<double>{0.5, 0.5}, {0.75, 0.25}}) {
      synth::plan p = base;
      for (auto& seg : p.ratios)
        seg = r;
      check_same(distributed<double>(g, p, comm, 40, default_steps, true), want, 1e-10,
                 "llama recomputed, " + p.strategy + " at " + std::to_string(r[0]));
    }
}
