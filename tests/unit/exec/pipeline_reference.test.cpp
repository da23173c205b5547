// The pipeline's semantics, run in one process as the oracle the distributed runner will be held
// to: a model cut into stages (graph/stages.hpp), a step of m micro-batches run in a schedule's
// order (program/pipeline.hpp) -- every device's instructions in the order their simulated spans
// start, boundary values handed forward and their gradients back through mailboxes -- gives the
// whole batch's loss and every parameter's gradient (f64, 1e-12), for GPipe, 1F1B and ZB-H1, two
// and three stages. One executor per (stage, micro-batch) holds that micro-batch's activations;
// ZB-H1's input-gradient instruction runs the whole backward here and its weight-gradient
// instruction nothing (splitting a stage's backward is the runner's work still to come).
#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/program/pipeline.hpp>

#include "../../support/tiny_bert.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

using namespace hspmd;

namespace {

// Micro-batch k's rows of a whole batch's ids (`per` sequences of `seq` each).
std::vector<std::int64_t> micro_rows(const std::vector<std::int64_t>& all, std::size_t k,
                                     std::size_t per, std::size_t seq) {
  const auto from = static_cast<std::ptrdiff_t>(k * per * seq);
  const auto n = static_cast<std::ptrdiff_t>(per * seq);
  return {all.begin() + from, all.begin() + from + n};
}

struct pipeline_result {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads; // summed over micro-batches, / m
};

pipeline_result run_pipeline(const models::bert_config& c, std::size_t batch,
                             const std::vector<std::size_t>& first_blocks,
                             const program::pipeline_schedule& s,
                             const std::vector<std::int64_t>& tokens,
                             const std::vector<std::int64_t>& targets) {
  const std::size_t m = s.micro, per = batch / m, stages = first_blocks.size();
  const graph::graph g = models::trace_bert_lm<double>(c, per);
  const auto cuts = graph::stages_at_blocks(g, first_blocks);
  std::vector<graph::stage_graph> sg;
  for (std::size_t k = 0; k < stages; ++k)
    sg.push_back(graph::extract_stage(g, cuts, k));
  // one executor per (stage, micro-batch), parameters from the same seed
  std::vector<std::vector<std::unique_ptr<exec::executor<double>>>> ex(stages);
  for (std::size_t k = 0; k < stages; ++k)
    for (std::size_t j = 0; j < m; ++j)
      ex[k].push_back(std::make_unique<exec::executor<double>>(sg[k].g, 17));
  // mailboxes: (stage, micro) -> values sent forward / gradients sent back
  std::map<std::pair<std::size_t, std::size_t>, std::vector<std::vector<double>>> forward_box,
      backward_box;
  const auto feed_data = [&](std::size_t k, std::size_t j) {
    for (graph::node_id i : sg[k].g.inputs()) {
      const std::string& name = sg[k].g[i].name;
      if (name == "tokens")
        ex[k][j]->set_input(name, micro_rows(tokens, j, per, c.seq));
      else if (name == "targets")
        ex[k][j]->set_input(name, micro_rows(targets, j, per, c.seq));
    }
  };
  pipeline_result r;
  // the global order: every instruction by its simulated start (dependencies hold in it)
  const program::pipeline_timeline t = program::simulate(s);
  std::vector<std::tuple<double, std::size_t, std::size_t>> order; // start, device, index
  for (std::size_t d = 0; d < s.devices; ++d)
    for (std::size_t i = 0; i < s.order[d].size(); ++i)
      order.emplace_back(t.spans[d][i].first, d, i);
  std::sort(order.begin(), order.end());
  for (const auto& [start, d, i] : order) {
    const program::pipeline_op& op = s.order[d][i];
    const std::size_t k = s.stage(d, op.chunk), j = op.micro;
    auto& e = *ex[k][j];
    if (op.what == program::pass::forward) {
      feed_data(k, j);
      for (std::size_t q = 0; q < sg[k].received.size(); ++q) {
        const auto& v = forward_box.at({k, j}).at(q);
        e.set_input(sg[k].g[sg[k].received[q].first].name, std::span<const double>(v));
      }
      for (graph::node_id gi : sg[k].gradient_inputs) { // not known yet: zeros
        const std::vector<double> zeros(sg[k].g[gi].out.size(), 0.0);
        e.set_input(sg[k].g[gi].name, std::span<const double>(zeros));
      }
      const double loss = e.forward();
      if (k + 1 == stages)
        r.loss += loss / static_cast<double>(m);
      else
        for (graph::node_id x : sg[k].sent)
          forward_box[{k + 1, j}].push_back(e.value_to_host(x));
    } else if (op.what != program::pass::backward_weight) {
      for (std::size_t q = 0; q < sg[k].gradient_inputs.size(); ++q) {
        const auto& gx = backward_box.at({k, j}).at(q);
        e.set_input(sg[k].g[sg[k].gradient_inputs[q]].name, std::span<const double>(gx));
      }
      e.backward();
      if (k > 0)
        for (const auto& received : sg[k].received)
          backward_box[{k - 1, j}].push_back(e.grad_to_host(received.first));
      for (graph::node_id p : sg[k].g.parameters()) {
        auto& acc = r.grads[sg[k].g[p].name];
        const auto gp = e.grad_to_host(p);
        acc.resize(gp.size(), 0.0);
        for (std::size_t q = 0; q < gp.size(); ++q)
          acc[q] += gp[q] / static_cast<double>(m);
      }
    }
  }
  return r;
}

} // namespace

TEST_CASE("pipeline reference: every schedule's order over the stages gives the whole batch's "
          "loss and gradients") {
  const auto c = test::tiny_bert(3);
  constexpr std::size_t batch = 4;
  std::vector<std::int64_t> tokens(batch * c.seq), targets(batch * c.seq);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int64_t>((i * 7 + 3) % c.vocab);
    targets[i] = static_cast<std::int64_t>((i * 5 + 1) % c.vocab);
  }
  const graph::graph whole_graph = models::trace_bert_lm<double>(c, batch);
  exec::executor<double> whole(whole_graph, 17);
  whole.set_input("tokens", tokens);
  whole.set_input("targets", targets);
  const double want = whole.forward();
  whole.backward();

  for (const auto& first_blocks :
       {std::vector<std::size_t>{0, 2}, std::vector<std::size_t>{0, 1, 2}})
    for (const auto kind : {program::schedule_kind::gpipe, program::schedule_kind::one_f_one_b,
                            program::schedule_kind::zero_bubble})
      for (const std::size_t m : {2UL, 4UL}) {
        const auto s = program::make_schedule(kind, first_blocks.size(), m);
        CAPTURE(first_blocks.size(), program::name(kind), m);
        const pipeline_result got = run_pipeline(c, batch, first_blocks, s, tokens, targets);
        CHECK(got.loss == Approx(want).epsilon(1e-12));
        REQUIRE(got.grads.size() == whole_graph.parameters().size());
        // relative to the largest gradient element of any parameter: the key bias's gradient is
        // zero but for rounding (~1e-18), which no two summation orders share
        double largest = 0;
        for (graph::node_id p : whole_graph.parameters())
          for (double v : whole.grad_to_host(p))
            largest = std::max(largest, std::abs(v));
        for (graph::node_id p : whole_graph.parameters()) {
          const auto gw = whole.grad_to_host(p);
          const auto& gp = got.grads.at(whole_graph[p].name);
          double worst = 0, scale = 1e-6 * largest;
          for (std::size_t q = 0; q < gw.size(); ++q) {
            worst = std::max(worst, std::abs(gp[q] - gw[q]));
            scale = std::max(scale, std::abs(gw[q]));
          }
          CAPTURE(whole_graph[p].name, worst, scale);
          CHECK(worst <= 1e-12 * scale);
        }
      }
}

TEST_CASE("an executor with activation slots holds several micro-batches and accumulates their "
          "gradients, its backward whole or split into input and weight gradients") {
  const auto c = test::tiny_bert(2);
  constexpr std::size_t batch = 6, m = 3, per = batch / m;
  std::vector<std::int64_t> tokens(batch * c.seq), targets(batch * c.seq);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int64_t>((i * 11 + 2) % c.vocab);
    targets[i] = static_cast<std::int64_t>((i * 3 + 5) % c.vocab);
  }
  const graph::graph whole_graph = models::trace_bert_lm<double>(c, batch);
  exec::executor<double> whole(whole_graph, 5);
  whole.set_input("tokens", tokens);
  whole.set_input("targets", targets);
  const double want = whole.forward();
  whole.backward();

  enum class mode { plain, recompute, split };
  for (const mode how : {mode::plain, mode::recompute, mode::split}) {
    CAPTURE(static_cast<int>(how));
    const graph::graph g = models::trace_bert_lm<double>(c, per);
    exec::executor<double> e(g, 5);
    e.set_activation_slots(m);
    e.set_accumulate_parameter_gradients(true);
    e.reuse_gradient_buffers();
    if (how == mode::recompute)
      e.recompute(exec::scope_segments(g));
    if (how == mode::split) { // weight-side: the parameters and what only they feed
      std::vector<bool> w(g.size(), false);
      for (graph::node_id i = 0; i < g.size(); ++i)
        w[i] = g[i].kind == graph::op::parameter ||
               (!g[i].inputs.empty() &&
                std::ranges::all_of(g[i].inputs, [&](graph::node_id j) { return w[j]; }));
      e.split_backward(w);
      CHECK_THROWS_AS(e.recompute(exec::scope_segments(g)), config_error);
    }
    CHECK_THROWS_AS(e.use_activation_slot(m), config_error);
    // forwards, each in its slot, and backwards in another order; split: input parts (I) and
    // weight parts (W) apart, forwards between them, as a zero-bubble schedule runs them
    const std::vector<std::pair<char, std::size_t>> order =
        how == mode::split ? std::vector<std::pair<char, std::size_t>>{{'F', 0}, {'F', 1}, {'I', 0},
                                                                       {'F', 2}, {'W', 0}, {'I', 1},
                                                                       {'I', 2}, {'W', 2}, {'W', 1}}
                           : std::vector<std::pair<char, std::size_t>>{
                                 {'F', 0}, {'F', 1}, {'F', 2}, {'B', 1}, {'B', 2}, {'B', 0}};
    double loss = 0;
    e.zero_parameter_gradients();
    for (const auto& [what, j] : order) {
      e.use_activation_slot(j);
      if (what == 'F') {
        e.set_input("tokens", micro_rows(tokens, j, per, c.seq));
        e.set_input("targets", micro_rows(targets, j, per, c.seq));
        loss += e.forward() / static_cast<double>(m);
      } else if (what == 'B') {
        e.backward();
      } else {
        const auto part = what == 'I' ? exec::backward_part::inputs : exec::backward_part::weights;
        e.begin_backward(part);
        for (graph::node_id i = static_cast<graph::node_id>(g.size()); i-- > 0;)
          e.backward_node(i, part);
      }
      if (what == 'I' && j == 0) // an input part leaves every parameter's gradient alone
        for (graph::node_id p : g.parameters())
          for (double v : e.grad_to_host(p))
            REQUIRE(v == 0.0);
    }
    CHECK_THROWS_AS(e.set_activation_slots(2), plan_error);
    CHECK(loss == Approx(want).epsilon(1e-12));
    double largest = 0; // (the key bias's gradient is rounding only: see above)
    for (graph::node_id p : whole_graph.parameters())
      for (double v : whole.grad_to_host(p))
        largest = std::max(largest, std::abs(v));
    for (graph::node_id p : g.parameters()) {
      const auto gw = whole.grad_to_host(whole.parameter(g[p].name));
      const auto gp = e.grad_to_host(p);
      double worst = 0, scale = 1e-4 * largest;
      for (std::size_t q = 0; q < gw.size(); ++q) {
        worst = std::max(worst, std::abs(gp[q] / static_cast<double>(m) - gw[q]));
        scale = std::max(scale, std::abs(gw[q]));
      }
      CAPTURE(g[p].name, worst, scale, largest);
      CHECK(worst <= 1e-12 * scale);
    }
  }
}
