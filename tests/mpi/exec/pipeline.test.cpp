// Pipeline execution under mpirun (exec/pipeline.hpp): a model cut into one stage per rank (or
// two per rank, interleaved), m micro-batches in each schedule's order, boundary values sent
// forward and gradients back between real processes -- the losses of a few SGD steps with
// gradient clipping and the parameters afterwards equal the single process's on the whole
// batch (f64 1e-10, f32 1e-5 relative to each tensor's scale), for MLP, BERT and Llama; and
// stage 0 holds p micro-batches under 1F1B where GPipe holds m.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/pipeline.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/models/zoo.hpp>

#include "../../support/equivalence.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

constexpr std::size_t pipeline_steps = 3;

template <class T>
test::result<T> pipelined(const graph::graph& whole, const graph::graph& micro_graph,
                          std::string_view prefix, const program::pipeline_schedule& s,
                          mpi_communicator& comm, std::size_t id_limit) {
  const auto blocks = graph::block_ranges(micro_graph, prefix);
  const std::size_t stages = s.devices * s.chunks;
  REQUIRE(blocks.size() >= stages);
  std::vector<std::size_t> first_blocks;
  for (std::size_t k = 0; k < stages; ++k)
    first_blocks.push_back(k * blocks.size() / stages);
  const auto cuts = graph::stages_at_blocks(micro_graph, first_blocks, prefix);
  exec::pipeline_executor<T, mpi_communicator> px(micro_graph, cuts, s, comm, 7);
  std::vector<exec::sgd> opts(px.chunks(), exec::sgd(0.05, 0.9));
  test::result<T> r;
  for (std::size_t step = 0; step < pipeline_steps; ++step) {
    const auto b = test::data_for<T>(whole, step, id_limit);
    for (const auto& [name, v] : b.values)
      px.set_input(name, std::span<const T>(v));
    for (const auto& [name, v] : b.ids)
      px.set_input(name, std::span<const std::int64_t>(v));
    px.set_step(step);
    r.losses.push_back(static_cast<double>(px.forward_backward()));
    const double norm = std::sqrt(px.grad_norm_squared());
    px.update(std::span<exec::sgd>(opts), exec::clip_scale(norm, test::clip));
  }
  for (graph::node_id p : whole.parameters())
    r.params[whole[p].name] = px.gather_parameter(whole[p].name);
  return r;
}

template <class T>
void pipeline_equivalence(const std::string& model, const models::model_options& o,
                          std::string_view prefix, std::size_t batch, std::size_t id_limit,
                          double tol, mpi_communicator& comm) {
  const auto p = static_cast<std::size_t>(comm.size());
  const graph::graph whole = models::trace_model<T>(model, o, batch);
  const test::result<T> want = test::single<T>(whole, id_limit, pipeline_steps);
  struct run {
    program::schedule_kind kind;
    std::size_t micro, chunks;
  };
  std::vector<run> runs;
  for (const auto kind : {program::schedule_kind::gpipe, program::schedule_kind::one_f_one_b,
                          program::schedule_kind::zero_bubble})
    for (const std::size_t m : {p, 2 * p})
      runs.push_back({kind, m, 1});
  runs.push_back({program::schedule_kind::interleaved, 2 * p, 2});
  for (const run& x : runs) {
    const auto s = program::make_schedule(x.kind, p, x.micro, x.chunks);
    CAPTURE(model, p, program::name(x.kind), x.micro, x.chunks);
    const graph::graph micro_graph = models::trace_model<T>(model, o, batch / x.micro);
    const test::result<T> got = pipelined<T>(whole, micro_graph, prefix, s, comm, id_limit);
    REQUIRE(got.losses.size() == want.losses.size());
    for (std::size_t k = 0; k < want.losses.size(); ++k)
      CHECK(std::abs(got.losses[k] - want.losses[k]) <= tol * std::abs(want.losses[k]));
    for (const auto& [name, w] : want.params) {
      const auto& v = got.params.at(name);
      REQUIRE(v.size() == w.size());
      double scale = 0, worst = 0;
      for (std::size_t q = 0; q < w.size(); ++q) {
        scale = std::max(scale, std::abs(static_cast<double>(w[q])));
        worst = std::max(worst, std::abs(static_cast<double>(v[q]) - static_cast<double>(w[q])));
      }
      CAPTURE(name, worst, scale);
      CHECK(worst <= tol * std::max(scale, 1e-3));
    }
  }
}

models::model_options small(std::size_t layers) {
  models::model_options o;
  o.layers = layers;
  o.hidden = 16;
  o.heads = 2;
  o.seq = 4;
  o.vocab = 24;
  return o;
}

} // namespace

TEST_CASE("pipeline: MLP, BERT and Llama stages on the ranks equal the single process for every "
          "schedule",
          "[pipeline]") {
  mpi_communicator world;
  const std::size_t p = static_cast<std::size_t>(world.size());
  if (p < 2) {
    WARN("a pipeline needs at least 2 ranks");
    return;
  }
  // two stages a rank (interleaved): 2p blocks at least; micro-batches of 2 rows at m = 2p
  const std::size_t layers = 2 * p, batch = 4 * p;
  models::model_options mlp;
  mlp.layers = layers;
  mlp.hidden = 12;
  pipeline_equivalence<double>("mlp", mlp, "fc", batch, 4, 1e-10, world);
  pipeline_equivalence<float>("mlp", mlp, "fc", batch, 4, 1e-5, world);
  pipeline_equivalence<double>("bert", small(layers), "layers.", batch, 24, 1e-10, world);
  pipeline_equivalence<float>("bert", small(layers), "layers.", batch, 24, 1e-5, world);
  pipeline_equivalence<double>("llama", small(layers), "layers.", batch, 24, 1e-10, world);
}

TEST_CASE("pipeline: stage 0 holds p micro-batches under 1F1B and m under GPipe", "[pipeline]") {
  mpi_communicator world;
  const std::size_t p = static_cast<std::size_t>(world.size());
  if (p < 2) {
    WARN("a pipeline needs at least 2 ranks");
    return;
  }
  const graph::graph g = models::trace_model<float>("bert", small(p), 2);
  const auto cuts = graph::balanced_stages(g, std::vector<double>(p, 1.0));
  for (const std::size_t m : {p, 2 * p, 4 * p}) {
    exec::pipeline_executor<float, mpi_communicator> one(
        g, cuts, program::make_schedule(program::schedule_kind::one_f_one_b, p, m), world);
    exec::pipeline_executor<float, mpi_communicator> all(
        g, cuts, program::make_schedule(program::schedule_kind::gpipe, p, m), world);
    const std::size_t d = static_cast<std::size_t>(world.rank());
    CHECK(one.slots(0) == p - d); // stage d holds p - d under 1F1B
    CHECK(all.slots(0) == m);
  }
}
