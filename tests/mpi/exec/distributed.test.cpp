// Numerical equivalence of distributed training with the single-process run: for each model,
// plan (synth and the baselines) and ratio vector (even, uneven, one with a zero-length shard),
// the losses of 10 SGD steps with gradient clipping and the parameters afterwards match the
// single process within 1e-5 (f32) or 1e-10 (f64) relative to the tensor's scale.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/comm/calibrate.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/synthesize.hpp>
#include <hspmd/train/profile.hpp>

#include "../../support/equivalence.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace hspmd;

using namespace hspmd::test;

namespace {

template <class T>
void equivalence(const std::string& model, const models::model_options& o, std::size_t batch,
                 std::size_t id_limit, double tol, double bandwidth) {
  hspmd::test::equivalence<T>(model, models::trace_model<T>(model, o, batch), id_limit, tol,
                              bandwidth);
}

models::model_options small_mlp() {
  models::model_options o;
  o.layers = 2;
  o.hidden = 24;
  return o;
}
models::model_options small_bert() {
  models::model_options o;
  o.layers = 2;
  o.hidden = 16;
  o.heads = 2;
  o.seq = 6;
  o.vocab = 40;
  return o;
}

// BERT-small with a 4-expert mixture in layer 1 (every second layer).
models::bert_config moe_small() {
  models::bert_config c;
  c.layers = 2;
  c.hidden = 16;
  c.ffn = 32;
  c.heads = 2;
  c.seq = 6;
  c.vocab = 40;
  c.moe_experts = 4;
  return c;
}

} // namespace

TEST_CASE("MLP: distributed training equals the single process (f32, f64)") {
  equivalence<float>("mlp", small_mlp(), 12, 10, 1e-5, 1e6);
  equivalence<double>("mlp", small_mlp(), 12, 10, 1e-10, 1e6);
}

TEST_CASE("BERT-small: distributed training equals the single process (f32, f64)") {
  equivalence<float>("bert", small_bert(), 4, 40, 1e-5, 1e6);
  equivalence<double>("bert", small_bert(), 4, 40, 1e-10, 1e6);
}

TEST_CASE("ViT-small and VGG-small: distributed training equals the single process (f32)") {
  models::vit_config vit;
  vit.image = 8;
  vit.layers = 1;
  vit.hidden = 16;
  vit.ffn = 32;
  vit.heads = 2;
  equivalence<float>("vit", models::trace_vit<float>(vit, 4), 10, 1e-5, 1e6);
  models::vgg_config vgg;
  vgg.stages = {{4, 4}, {8}, {8}};
  vgg.image = 8;
  vgg.fc = 16;
  vgg.pooled = 1;
  equivalence<float>("vgg", models::trace_vgg<float>(vgg, 4), 10, 1e-5, 1e6);
}

TEST_CASE("intermediate gradients share buffers: less gradient memory, the same training") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto g = models::trace_model<float>("bert", small_bert(), 4);
  const synth::plan p =
      synth::make_baseline(g, make_cluster(n, 1e6), synth::baseline::dp_cp, {}, "bert");
  exec::distributed_executor<float, mpi_communicator> dx(g, p, comm, 7);
  std::size_t params = 0;
  for (graph::node_id id : dx.program().local.parameters())
    params += dx.program().local[id].out.size() * sizeof(float);
  CAPTURE(dx.gradient_bytes(), dx.gradient_bytes_unshared(), params);
  CHECK(dx.gradient_bytes() >= params); // every parameter keeps its gradient
  // The activations' gradients: at most half of what one buffer per version would take.
  CHECK(dx.gradient_bytes() - params < (dx.gradient_bytes_unshared() - params) / 2);
  // (every equivalence test above trains with shared buffers)
}

TEST_CASE("MoE-small: distributed training equals the single process (f32)") {
  models::bert_config c = moe_small();
  // Token-parallel routing is per rank (each rank's tokens fill its share of the capacity):
  // it equals the single process when no token is dropped, so the capacity here holds every
  // token even on the smallest share (4 T slots per expert).
  c.capacity_factor = 8.0;
  equivalence<float>("bert-moe", models::trace_bert_lm<float>(c, 4), 40, 1e-5, 1e6);

  // At the default capacity tokens are dropped; routing every token globally (replicated or
  // hidden-parallel dispatch, expert-parallel combine) still gives the single process's
  // numbers exactly: the TP baseline, and a plan whose combine must run expert parallel.
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  c.capacity_factor = 1.25;
  const auto g = models::trace_bert_lm<float>(c, 4);
  const auto want = single<float>(g, 40, default_steps);
  const cluster cl = make_cluster(n, 1e6);
  const synth::plan tp = synth::make_baseline(g, cl, synth::baseline::tp, {}, "moe");
  check_same(distributed<float>(g, tp, comm, 40, default_steps), want, 1e-5,
             "bert-moe tp, tokens dropped");
  synth::synth_options so;
  so.search.allow_rule = [&g](graph::node_id id, const graph::rule& r) {
    if (g[id].kind == graph::op::moe_combine)
      return r.kind == graph::rule::family::expert;
    return g[id].kind != graph::op::moe_dispatch || !r.in[1].is_split(); // global routing
  };
  synth::plan ep = from_rank0(comm, g, [&] { return synth::synthesize(g, cl, so, "moe"); });
  std::vector<std::vector<double>> ratios = {ep.ratios[0]};
  if (n == 3)
    ratios.push_back({0.5, 0.0, 0.5}); // rank 1 holds no expert
  for (const auto& r : ratios) {
    for (auto& seg : ep.ratios)
      seg = r;
    check_same(distributed<float>(g, ep, comm, 40, default_steps), want, 1e-5,
               "bert-moe expert parallel");
  }
}

TEST_CASE("a plan mixing per-rank and global MoE routing is refused when lowered") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  if (n == 1)
    return;
  const auto g = models::trace_bert_lm<float>(moe_small(), 4);
  synth::plan p = synth::make_baseline(g, make_cluster(n, 1e6), synth::baseline::dp_cp, {}, "moe");
  // Make the combine route globally (replicated) while the dispatch stays token parallel.
  bool changed = false;
  for (synth::plan_step& s : p.steps)
    if (g[s.node].kind == graph::op::moe_combine && s.rule.kind == graph::rule::family::split) {
      s.rule = graph::rules_of(g, s.node).items[0];
      changed = true;
    }
  REQUIRE(changed);
  CHECK_THROWS_WITH(program::lower(g, p, 0),
                    Catch::Contains("token parallel") &&
                        Catch::Contains("run both steps of the MoE layer"));
}

TEST_CASE("ranks given different clusters stop before any training collective, naming it") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto g = models::trace_model<float>("mlp", small_mlp(), 12);
  // Every rank its own link bandwidth when there are several ranks: different cluster files.
  const cluster c = make_cluster(n, 1e6 * double(1 + comm.rank()));
  const synth::plan p = synth::make_baseline(g, c, synth::baseline::dp_ev, {}, "mlp");
  if (n == 1) {
    CHECK_NOTHROW(exec::distributed_executor<float, mpi_communicator>(g, p, comm, 7));
    return;
  }
  CHECK_THROWS_WITH((exec::distributed_executor<float, mpi_communicator>(g, p, comm, 7)),
                    Catch::Contains("rank 1: its cluster file differs from rank 0's") &&
                        Catch::Contains("give every rank the same cluster file"));
  // A plan for another model (the batch differs on rank 1).
  const auto other = models::trace_model<float>("mlp", small_mlp(), comm.rank() == 1 ? 6 : 12);
  const cluster same = make_cluster(n, 1e6);
  const synth::plan q = synth::make_baseline(other, same, synth::baseline::dp_ev, {}, "mlp");
  CHECK_THROWS_WITH((exec::distributed_executor<float, mpi_communicator>(other, q, comm, 7)),
                    Catch::Contains("rank 1: its model (traced graph) differs"));
  // The right number of ranks is checked first.
  synth::plan bigger = synth::make_baseline(g, make_cluster(n + 1, 1e6), synth::baseline::dp_ev);
  CHECK_THROWS_WITH((exec::distributed_executor<float, mpi_communicator>(g, bigger, comm, 7)),
                    Catch::Contains("launch one rank per device"));
}

TEST_CASE("a plan priced by measurement (rank 0's compute profile, calibrated collectives) is "
          "the same on every rank and trains like the single process") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto g = models::trace_model<float>("mlp", small_mlp(), 12);
  cluster c = make_cluster(n, 1e9);
  train::profile_options po;
  po.repetitions = 2;
  synth::synth_options so;
  so.profile = exec::measure_compute_on_rank0<float>(g, c.devices[0].speed, comm, po);
  REQUIRE(so.profile->seconds.size() == g.size());
  calibration_options co;
  co.sizes_bytes = {1U << 10U, 1U << 16U};
  co.repetitions = 2;
  c.set_collective_costs(calibrate_collectives(comm, co));
  // Rank 0's measurement reaches every rank bit for bit, so every rank plans alike; the
  // executor's agreement check would name any difference.
  std::string bits;
  for (double s : so.profile->seconds)
    bits += std::to_string(s) + " ";
  const std::uint64_t h = fnv1a64(bits);
  CHECK(comm.all_reduce(h, reduce_op::min) == h);
  CHECK(comm.all_reduce(h, reduce_op::max) == h);
  const synth::plan p = synth::synthesize(g, c, so, "mlp");
  check_same(distributed<float>(g, p, comm, 10, default_steps), single<float>(g, 10, default_steps),
             1e-5, "mlp calibrated");
}
