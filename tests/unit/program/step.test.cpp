// The step program (program/step.hpp): one ordered list per rank that the executor runs and the
// simulator prices. Its structure is checked here without hardware: every op and transfer once
// in each pass, in graph order and back; every gradient bucket posted once, after the backward
// that completes it; recomputation's replays before their segment's backward; FSDP copies
// gathered again before their last reader's backward. (That the executor runs exactly this list
// is checked under MPI: tests/support/equivalence.hpp, `check_program_ran`.)
#include <hspmd/program/step.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"
#include "../sim/small_bert.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <set>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

synth::plan baseline_plan(const graph::graph& g, const cluster& c, synth::baseline b) {
  synth::synth_options o;
  o.search.max_expansions = 20000;
  return synth::make_baseline(g, c, b, o, "bert");
}

// Where instruction (op, node) sits in the program, or the program's size.
std::size_t at(const program::step_program& sp, program::code op, graph::node_id node) {
  for (std::size_t k = 0; k < sp.code.size(); ++k)
    if (sp.code[k].op == op && sp.code[k].node == node)
      return k;
  return sp.code.size();
}

} // namespace

TEST_CASE("a step program runs every op and transfer once each way, in graph order and back") {
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({1e9, 1e9}, 1e8);
  for (synth::baseline b : {synth::baseline::dp_ev, synth::baseline::tp}) {
    const synth::plan p = baseline_plan(g, c, b);
    CAPTURE(p.strategy);
    const program::local_program lp = program::lower(g, p, 0);
    program::step_options o;
    o.bucket_bytes = 16384; // several buckets
    const program::step_program sp = program::build(lp, g, o);
    std::size_t runs = 0; // local nodes with work (not loads)
    for (graph::node_id i = 0; i < lp.local.size(); ++i)
      runs += program::is_load(lp, i) ? 0U : 1U;

    const auto forward = sp.part(program::section::forward);
    REQUIRE(forward.size() == runs + 1);
    CHECK(forward.back().op == program::code::loss);
    for (std::size_t k = 1; k + 1 < forward.size(); ++k)
      CHECK(forward[k - 1].node < forward[k].node);

    std::vector<graph::node_id> back;
    std::vector<std::size_t> posted;
    for (const program::instruction& in : sp.part(program::section::backward)) {
      if (in.op == program::code::backward || in.op == program::code::move_back)
        back.push_back(in.node);
      if (in.op == program::code::post)
        posted.push_back(in.bucket);
    }
    CHECK(back.size() == runs);
    CHECK(std::ranges::is_sorted(back, std::ranges::greater{}));

    // Buckets: every replicated parameter once, each bucket posted once, in order, after the
    // backward of the node that completes its gradients.
    std::set<graph::node_id> in_buckets;
    for (const program::gradient_bucket& gb : sp.buckets)
      for (graph::node_id w : gb.params)
        CHECK(in_buckets.insert(w).second);
    std::size_t replicated = 0;
    for (const program::lowered_transfer& t : lp.transfers)
      replicated += t.what.kind == synth::transfer_kind::load &&
                            g[t.what.tensor].kind == graph::op::parameter &&
                            t.what.to.is_replicated()
                        ? 1U
                        : 0U;
    CHECK(in_buckets.size() + sp.sfb.size() == replicated);
    if (b == synth::baseline::dp_ev)
      CHECK(sp.buckets.size() > 1);
    REQUIRE(posted.size() == sp.buckets.size());
    for (std::size_t k = 0; k < posted.size(); ++k) {
      CHECK(posted[k] == k);
      const std::size_t post = [&] {
        for (std::size_t j = 0; j < sp.code.size(); ++j)
          if (sp.code[j].op == program::code::post && sp.code[j].bucket == k)
            return j;
        return sp.code.size();
      }();
      const graph::node_id ready = sp.buckets[k].ready_at;
      const std::size_t done =
          std::min(at(sp, program::code::backward, ready), at(sp, program::code::move_back, ready));
      CHECK(done < post);
    }
    if (!sp.buckets.empty())
      CHECK(sp.part(program::section::backward).back().op == program::code::wait);
    const auto tail = sp.part(program::section::optimizer);
    REQUIRE(tail.size() == 2);
    CHECK(tail[0].op == program::code::norm);
    CHECK(tail[1].op == program::code::update);
  }
}

TEST_CASE("one device's program has no buckets and no wait") {
  const graph::graph g = test::small_bert(4);
  const cluster c = test::make_cluster({1e9});
  const synth::plan p = baseline_plan(g, c, synth::baseline::dp_ev);
  const program::local_program lp = program::lower(g, p, 0);
  const program::step_program sp = program::build(lp, g);
  CHECK(sp.buckets.empty());
  for (const program::instruction& in : sp.code) {
    CHECK(in.op != program::code::post);
    CHECK(in.op != program::code::wait);
  }
}

TEST_CASE("recomputation replays a block's inner nodes just before the block's backward") {
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({1e9, 1e9}, 1e8);
  const synth::plan p = baseline_plan(g, c, synth::baseline::dp_ev);
  const program::local_program lp = program::lower(g, p, 0);
  program::step_options o;
  o.recompute = true;
  const program::step_program sp = program::build(lp, g, o);
  REQUIRE(sp.segments.size() == 2); // the two layers
  std::size_t replays = 0;
  for (const program::recompute_segment& sg : sp.segments) {
    REQUIRE(!sg.internal.empty());
    const std::size_t last = std::min(at(sp, program::code::backward, sg.last),
                                      at(sp, program::code::move_back, sg.last));
    REQUIRE(last < sp.code.size());
    std::size_t previous = 0;
    for (graph::node_id j : sg.internal) {
      const std::size_t r = at(sp, program::code::replay, j);
      INFO("node " << j << " of segment [" << sg.first << ", " << sg.last << "]");
      CHECK(r < last); // before the segment's backward
      CHECK(r >= sp.begin(program::section::backward));
      CHECK(r >= previous); // in forward order
      previous = r;
      ++replays;
    }
  }
  std::size_t counted = 0;
  for (const program::instruction& in : sp.code)
    counted += in.op == program::code::replay ? 1U : 0U;
  CHECK(counted == replays);
  // Without recomputation: nothing replayed.
  const program::step_program plain = program::build(lp, g);
  CHECK(plain.segments.empty());
  CHECK(plain.code.size() + replays == sp.code.size());
}

TEST_CASE("instructions are named as traces show them") {
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({1e9, 1e9}, 1e8);
  const synth::plan p = baseline_plan(g, c, synth::baseline::tp);
  const program::local_program lp = program::lower(g, p, 0);
  const program::step_program sp = program::build(lp, g);
  std::size_t moves = 0;
  for (const program::instruction& in : sp.code) {
    const std::string n = program::name(in, lp, g);
    switch (in.op) {
    case program::code::forward:
      CHECK(n == "forward " + g[lp.global[in.node]].name);
      break;
    case program::code::move: {
      const synth::transfer& t = program::transfer_at(lp, in.node);
      CHECK(n == std::string(synth::name(t.kind)) + " " + g[t.tensor].name);
      ++moves;
      break;
    }
    case program::code::move_back: {
      const synth::transfer& t = program::transfer_at(lp, in.node);
      CHECK(n == std::string(synth::name(synth::dual(t.kind))) + " " + g[t.tensor].name);
      break;
    }
    default:
      CHECK(!n.empty());
    }
  }
  CHECK(moves > 0); // tensor parallelism moves activations
}
