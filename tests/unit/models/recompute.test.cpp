// Activation recomputation (exec::executor::recompute): the backward runs each block's forward
// again instead of keeping its values; losses and gradients stay bit-identical, and the values
// kept for the backward shrink.
#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/llama.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

// Loss and every parameter gradient of one forward and backward at `step`, with or without
// recomputation of `g`'s blocks; `bytes` gets the recomputed segments' shared buffer.
template <class T>
std::vector<std::vector<T>> step_of(const graph::graph& g, bool recompute, std::size_t& bytes,
                                    std::size_t batch, std::size_t seq, std::size_t vocab) {
  exec::executor<T> ex(g, 11);
  bytes = recompute ? ex.recompute(exec::scope_segments(g)) : 0;
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<std::int64_t> token(0, static_cast<std::int64_t>(vocab) - 1);
  std::vector<std::int64_t> ids(batch * seq);
  std::vector<std::int64_t> targets(batch * seq);
  for (auto& t : ids)
    t = token(rng);
  for (auto& t : targets)
    t = token(rng);
  ex.set_training(true);
  ex.set_step(5);
  ex.set_input("tokens", ids);
  ex.set_input("targets", targets);
  std::vector<std::vector<T>> out{{ex.forward()}};
  ex.backward();
  for (graph::node_id p : g.parameters())
    out.push_back(ex.grad_to_host(p));
  return out;
}

std::size_t internal_bytes(const graph::graph& g) {
  exec::executor<float> ex(g, 1);
  ex.recompute(exec::scope_segments(g));
  std::size_t n = 0;
  for (const auto& s : ex.recompute_segments())
    for (graph::node_id i : s.internal)
      n += g[i].out.size() * sizeof(float);
  return n;
}

// Three BERT blocks with dropout, two Llama blocks with fused attention: small enough for the
// sanitizers.
models::bert_config recompute_bert() {
  models::bert_config c;
  c.layers = 3;
  c.hidden = 32;
  c.heads = 2;
  c.ffn = 64;
  c.seq = 8;
  c.vocab = 40;
  c.dropout = 0.1;
  return c;
}
models::llama_config small_llama() {
  models::llama_config c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.ffn = 48;
  c.seq = 8;
  c.vocab = 30;
  c.fused_attention = true;
  return c;
}

} // namespace

TEST_CASE("recomputing BERT's blocks (dropout on) gives the same loss and gradients, bit for bit") {
  const models::bert_config c = recompute_bert();
  const graph::graph g = models::trace_bert_lm<float>(c, 2);
  const auto segments = exec::scope_segments(g);
  REQUIRE(segments.size() == 3);
  for (std::size_t k = 1; k < segments.size(); ++k)
    CHECK(segments[k].first > segments[k - 1].second);
  std::size_t kept = 0;
  std::size_t shared = 0;
  const auto plain = step_of<float>(g, false, kept, 2, 8, 40);
  const auto again = step_of<float>(g, true, shared, 2, 8, 40);
  REQUIRE(plain.size() == again.size());
  for (std::size_t k = 0; k < plain.size(); ++k) {
    INFO("item " << k << " (0: the loss, then the parameters' gradients)");
    CHECK(plain[k] == again[k]);
  }
  // One block's values in the shared buffer instead of three blocks'.
  const std::size_t internal = internal_bytes(g);
  INFO("shared " << shared << " bytes, recomputed values " << internal << " bytes");
  CHECK(shared > 0);
  CHECK(shared * 2 < internal);
}

TEST_CASE("recomputing Llama's blocks (fused attention) gives the same loss and gradients") {
  const models::llama_config c = small_llama();
  const graph::graph g = models::trace_llama_lm<double>(c, 2);
  REQUIRE(exec::scope_segments(g).size() == 2);
  std::size_t kept = 0;
  std::size_t shared = 0;
  const auto plain = step_of<double>(g, false, kept, 2, 8, 30);
  const auto again = step_of<double>(g, true, shared, 2, 8, 30);
  REQUIRE(plain.size() == again.size());
  for (std::size_t k = 0; k < plain.size(); ++k) {
    INFO("item " << k);
    CHECK(plain[k] == again[k]);
  }
  CHECK(shared > 0);
}

TEST_CASE("recomputation segments are checked") {
  models::bert_config c;
  c.layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  c.seq = 4;
  c.vocab = 20;
  const graph::graph g = models::trace_bert_lm<float>(c, 1);
  exec::executor<float> ex(g, 1);
  CHECK_THROWS_WITH(ex.recompute({{5, 9}, {8, 12}}), Catch::Contains("not after the one before"));
  exec::executor<float> ok(g, 1);
  ok.recompute({{5, 9}});
  CHECK_THROWS_WITH(ok.recompute({{10, 12}}), Catch::Contains("already set"));
  CHECK(exec::scope_segments(g, "nothing.").empty());
}

TEST_CASE("the planner prices what the executor recomputes: the same values, one block's buffer") {
  const models::bert_config b = recompute_bert();
  const models::llama_config l = small_llama();
  for (const graph::graph& g :
       {models::trace_bert_lm<float>(b, 2), models::trace_llama_lm<float>(l, 2)}) {
    exec::executor<float> ex(g, 1);
    const std::size_t pool = ex.recompute(exec::scope_segments(g));
    std::vector<bool> run_again(g.size(), false);
    std::size_t count = 0;
    for (const auto& s : ex.recompute_segments())
      for (graph::node_id i : s.internal) {
        run_again[i] = true;
        ++count;
      }
    const graph::block_layout layout = graph::layout_blocks(g, graph::block_ranges(g));
    for (graph::node_id i = 0; i < g.size(); ++i) {
      CAPTURE(g[i].name);
      CHECK(run_again[i] == layout.recomputed[i]);
    }
    // One device: the plan's largest block (its ops' outputs; the plan's copies between
    // placements are not made by one process) is the executor's shared buffer, up to its
    // alignment (16 elements per value).
    const cluster one = test::make_cluster({1e12});
    synth::synth_options o;
    o.search.recompute = synth::search_options::recomputation::always;
    o.search.max_expansions = 2000; // (one device: any program, all cost the same)
    const synth::plan p = synth::synthesize(g, one, o);
    REQUIRE(p.recompute);
    const synth::cost_model m(g, one, synth::segment_map(g, p.segments));
    std::vector<double> per_block(layout.ranges.size(), 0.0);
    for (const synth::plan_step& s : p.steps)
      if (const std::size_t k = m.recomputed_block(s.node); k != synth::cost_model::none)
        per_block.at(k) += synth::value_at(m.memory_of(s.node, s.rule.out), p.ratios, 0);
    const double largest = *std::max_element(per_block.begin(), per_block.end());
    CAPTURE(pool, largest, count);
    CHECK(largest > 0.0);
    CHECK(largest <= static_cast<double>(pool));
    CHECK(static_cast<double>(pool) <= largest + 64.0 * static_cast<double>(count));
  }
}
