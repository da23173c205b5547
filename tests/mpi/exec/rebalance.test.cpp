// Re-balancing while training: box-intersection resharding moves any layout to any other
// (exec/reshard.hpp); a rank engine switched to another plan mid-run (same program at new
// ratios, or another program) trains on exactly as the run that never switched; and the
// trainer, with one rank slowed down by HSPMD_FAULT, notices, re-solves and moves its state
// while its losses stay those of the undisturbed run.
#include <algorithm>

#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/exec/reshard.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/plan_cache.hpp>
#include <hspmd/synth/synthesize.hpp>
#include <hspmd/train/distributed_engine.hpp>
#include <hspmd/train/rebalance.hpp>
#include <hspmd/train/trainer.hpp>

#include "../../support/equivalence.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

// Every rank's box of a (dims) tensor: whole (replicated), or split along `dim` by `lengths`.
std::vector<exec::box> layout(const std::vector<std::size_t>& dims, std::optional<std::size_t> dim,
                              const std::vector<std::size_t>& lengths, std::size_t ranks) {
  std::vector<exec::box> out(ranks, exec::box::whole(dims));
  if (!dim)
    return out;
  std::size_t at = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    out[r].offset[*dim] = at;
    out[r].length[*dim] = lengths[r];
    at += lengths[r];
  }
  return out;
}

// The elements of box `b` of a tensor of `dims`, each its row-major global index.
std::vector<double> piece(const std::vector<std::size_t>& dims, const exec::box& b) {
  std::vector<double> v(b.size());
  std::vector<std::size_t> at(dims.size(), 0);
  for (std::size_t k = 0; k < v.size(); ++k) {
    std::size_t g = 0;
    for (std::size_t d = 0; d < dims.size(); ++d)
      g = g * dims[d] + b.offset[d] + at[d];
    v[k] = static_cast<double>(g);
    for (std::size_t d = dims.size(); d-- > 0;) {
      if (++at[d] < b.length[d])
        break;
      at[d] = 0;
    }
  }
  return v;
}

// Splits `n` by `weights` (largest remainder is not needed here: the rest goes to the last).
std::vector<std::size_t> split_by(std::size_t n, const std::vector<double>& weights) {
  double sum = 0.0;
  for (double w : weights)
    sum += w;
  std::vector<std::size_t> out;
  std::size_t given = 0;
  for (std::size_t r = 0; r + 1 < weights.size(); ++r) {
    out.push_back(static_cast<std::size_t>(double(n) * weights[r] / sum));
    given += out.back();
  }
  out.push_back(n - given);
  return out;
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

} // namespace

TEST_CASE("resharding moves every layout to every other, replicas and empty pieces included") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::vector<std::size_t> dims{7, 5, 3};
  std::vector<double> uneven(n, 1.0);
  uneven[0] = 3.0;
  std::vector<double> zero(n, 1.0);
  if (n > 1)
    zero[n / 2] = 0.0; // one rank holds an empty piece
  std::vector<std::vector<exec::box>> layouts;
  layouts.push_back(layout(dims, std::nullopt, {}, n));
  for (std::size_t d = 0; d < dims.size(); ++d)
    for (const auto& w : {std::vector<double>(n, 1.0), uneven, zero})
      layouts.push_back(layout(dims, d, split_by(dims[d], w), n));
  // All pairs at once (one all-to-all), plus a scalar replicated everywhere.
  std::vector<std::vector<double>> before, after;
  std::vector<exec::reshard_item<double>> items;
  for (const auto& from : layouts)
    for (const auto& to : layouts) {
      before.push_back(piece(dims, from[me]));
      after.emplace_back(to[me].size(), -1.0);
    }
  before.push_back({42.0});
  after.push_back({-1.0});
  std::size_t k = 0;
  for (const auto& from : layouts)
    for (const auto& to : layouts) {
      items.push_back({from, to, before[k], after[k], "t" + std::to_string(k)});
      ++k;
    }
  const std::vector<exec::box> scalar(n, exec::box::whole({}));
  items.push_back({scalar, scalar, before[k], after[k], "scalar"});
  exec::reshard(comm, std::span<const exec::reshard_item<double>>(items));
  k = 0;
  for (const auto& from : layouts)
    for (const auto& to : layouts) {
      (void)from;
      INFO("pair " << k << ": rank " << me << " box " << to[me].to_string());
      CHECK(after[k] == piece(dims, to[me]));
      ++k;
    }
  CHECK(after[k] == std::vector<double>{42.0});

  // Old pieces that overlap without being replicas are refused on every rank, before any
  // message (no rank is left waiting).
  if (n > 1) {
    auto bad = layout(dims, 0, split_by(dims[0], std::vector<double>(n, 1.0)), n);
    bad[1].offset[0] -= 1;
    bad[1].length[0] += 1;
    std::vector<double> mine(bad[me].size(), 0.0);
    std::vector<double> out(dims[0] * dims[1] * dims[2]);
    const std::vector<exec::reshard_item<double>> one = {{bad, layout(dims, std::nullopt, {}, n),
                                                          std::span<const double>(mine),
                                                          std::span<double>(out), "w"}};
    CHECK_THROWS_WITH(exec::reshard(comm, std::span<const exec::reshard_item<double>>(one)),
                      Catch::Contains("resharding w: rank 1 holds") &&
                          Catch::Contains("overlaps rank 0"));
  }
}

namespace {

using engine_t =
    train::distributed_engine<double, exec::adam, mpi_communicator, exec::host_backend>;

struct run {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;
};

// Adam with clipping for `steps` steps under plan `a`; with `b`, the engine switches to it
// after step `at`.
run train_run(const graph::graph& g, mpi_communicator& comm, const synth::plan& a,
              const synth::plan* b, std::size_t at, std::size_t steps) {
  engine_t e(g, a, comm, 7);
  e.set_bucket_bytes(256);
  exec::adam opt(3e-3);
  run r;
  for (std::size_t s = 0; s < steps; ++s) {
    if (b != nullptr && s == at)
      e.rebalance(*b, opt);
    const auto data = test::data_for<double>(g, s, 40);
    for (const auto& [name, v] : data.values)
      e.set_input(name, std::span<const double>(v));
    for (const auto& [name, v] : data.ids)
      e.set_input(name, std::span<const std::int64_t>(v));
    e.set_step(s);
    r.losses.push_back(e.forward());
    e.backward();
    e.step(opt, exec::clip_scale(e.grad_norm(), 0.5));
  }
  for (graph::node_id p : g.parameters())
    r.params[g[p].name] = e.whole(p);
  return r;
}

// Parameters equal within `tol` of their scale. A key projection's bias has no gradient in
// exact arithmetic (softmax is invariant to it), so it holds rounding noise that Adam scales by
// lr / eps, differently in every layout: a tensor whose largest value is below 1e-9 is held to
// 1e-11 absolute.
void check_param(const std::string& name, const std::vector<double>& v,
                 const std::vector<double>& w, double tol) {
  REQUIRE(v.size() == w.size());
  double scale = 0.0;
  double worst = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    scale = std::max(scale, std::abs(w[i]));
    worst = std::max(worst, std::abs(v[i] - w[i]));
  }
  INFO("parameter " << name << ": max difference " << worst << " at scale " << scale);
  CHECK(worst <= (scale < 1e-9 ? 1e-11 : tol * std::max(scale, 1e-3)));
}

void check_same(const run& got, const run& want, double tol) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s) {
    INFO("step " << s << ": " << got.losses[s] << " vs " << want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= tol * std::abs(want.losses[s]));
  }
  for (const auto& [name, w] : want.params)
    check_param(name, got.params.at(name), w, tol);
}

} // namespace

TEST_CASE("a run switched to new ratios or another program mid-run trains on as if it had not") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = models::trace_model<double>("bert", small_bert(), 4);
  const cluster c = test::make_cluster(n, 1e6);
  const synth::plan dp = synth::make_baseline(g, c, synth::baseline::dp_cp, {}, "bert");
  // The same program at the ratios of a cluster whose rank 1 got four times slower (the
  // re-balancing path: a warm-startable re-solve of the program's ratio LP).
  std::vector<double> factors(n, 1.0);
  factors[n - 1] = 4.0;
  const cluster slower = train::measured_cluster(c, factors);
  const auto resolved = synth::resolve_ratios(
      dp, synth::cost_model(g, slower, synth::segment_map(g, dp.segments)), slower);
  REQUIRE(resolved);
  REQUIRE(resolved->p.ratios != dp.ratios);
  const synth::plan tp = synth::make_baseline(g, c, synth::baseline::tp, {}, "bert");

  const run straight = train_run(g, comm, dp, nullptr, 0, 6);
  SECTION("the same program at re-solved ratios") {
    check_same(train_run(g, comm, dp, &resolved->p, 3, 6), straight, 1e-10);
  }
  SECTION("another program (tensor parallel): parameters and moments change placement") {
    check_same(train_run(g, comm, dp, &tp, 3, 6), straight, 1e-10);
  }
  SECTION("switched before the first step: no optimizer state yet") {
    check_same(train_run(g, comm, dp, &tp, 0, 4), train_run(g, comm, dp, nullptr, 0, 4), 1e-10);
  }
}

TEST_CASE("the trainer re-balances a rank slowed down mid-run, and its losses stay the same") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const graph::graph g = models::trace_model<double>("bert", small_bert(), 8);
  train::train_options o;
  o.cluster_spec = test::make_cluster(std::vector<double>(n, 1e9), 1e9);
  o.plan = "dp-cp";
  o.steps = 12;
  o.lr = train::lr_schedule::constant(3e-3);
  o.out = nullptr;
  const exec::feed_fn<double> feed = [&](exec::batch_sink<double>& b, std::size_t s) {
    const auto data = test::data_for<double>(g, s, 40);
    for (const auto& [name, v] : data.values)
      b.set_input(name, std::span<const double>(v));
    for (const auto& [name, v] : data.ids)
      b.set_input(name, std::span<const std::int64_t>(v));
  };
  train::trainer<double> plain(g, o);
  const auto want = plain.fit(feed);

  o.rebalance = 1.25;
  o.rebalance_window = 2;
  o.rebalance_persist = 2; // 6x slower: two windows are evidence enough, and leave steps to act
  ::setenv("HSPMD_FAULT", ("rank:" + std::to_string(n - 1) + ",at:step4,kind:slow:6").c_str(), 1);
  train::trainer<double> tr(g, o);
  ::unsetenv("HSPMD_FAULT");
  const double before = tr.plan()->ratios[0][n - 1];
  const auto got = tr.fit(feed);
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    INFO("step " << s << ": " << got.losses[s] << " vs " << want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= 1e-10 * std::abs(want.losses[s]));
  }
  // At least one re-balance after the slowdown moved state. How far the share falls depends on
  // the measured times (a busy machine slows the other rank too), so it is not asserted; what
  // is: every re-balance that moved state acted on its trigger -- the device furthest off
  // (factor f, or 1/f when it runs ahead of the others) lost share when slow, gained it when
  // fast -- and the slowed rank ends with less than it started with.
  bool moved_after = false;
  for (const auto& r : got.rebalances) {
    moved_after = moved_after || (r.moved && r.after_step >= 4);
    if (!r.moved)
      continue;
    const auto off = [](double f) { return f >= 1.0 ? f : 1.0 / f; };
    std::size_t worst = 0;
    for (std::size_t d = 1; d < r.factors.size(); ++d)
      if (off(r.factors[d]) > off(r.factors[worst]))
        worst = d;
    INFO("re-balance after step " << r.after_step << ": device " << worst << " factor "
                                  << r.factors[worst]);
    if (r.factors[worst] > 1.0)
      CHECK(r.shares_after.at(worst) < r.shares_before.at(worst));
    else
      CHECK(r.shares_after.at(worst) > r.shares_before.at(worst));
  }
  CHECK(moved_after);
  const double after = tr.plan()->ratios[0][n - 1];
  INFO("share of the slowed rank: " << before << " -> " << after);
  CHECK(after < before);
  // Every rank reports the same events.
  const auto events = static_cast<std::int64_t>(got.rebalances.size());
  CHECK(comm.all_reduce(events, reduce_op::max) == comm.all_reduce(events, reduce_op::min));
  // The parameters too (each rank gathers every parameter whole).
  for (graph::node_id p : g.parameters())
    check_param(g[p].name, tr.value(g[p].name), plain.value(g[p].name), 1e-10);
}
