#pragma once
// Numerical equivalence of distributed training with the single-process run, shared by the MPI
// tests of the models: 10 SGD steps with gradient clipping on seeded data, every plan strategy
// (synth on a slow and a fast link, DP-EV, DP-CP, TP, DP-CP with SFB) at every ratio vector of
// the rank count (even; 3:1 at 2 ranks; 5:3:1 and 1:0:1 at 3), losses and parameters compared
// within `tol` relative to each tensor's scale.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace hspmd::test {

// n devices, d0 the fastest: speeds n, n - 1, ..., 1 Gflop/s.
inline cluster make_cluster(std::size_t n, double bandwidth) {
  std::vector<double> speeds;
  for (std::size_t d = 0; d < n; ++d)
    speeds.push_back(1e9 * double(n - d));
  return hspmd::test::make_cluster(speeds, bandwidth);
}

// The whole batch of step s: features uniform in [-1, 1), ids uniform in [0, limit).
template <class T>
struct batch_data {
  std::map<std::string, std::vector<T>> values;
  std::map<std::string, std::vector<std::int64_t>> ids;
};
template <class T>
batch_data<T> data_for(const graph::graph& g, std::size_t step, std::size_t id_limit) {
  batch_data<T> b;
  for (graph::node_id i : g.inputs()) {
    const auto& n = g[i];
    const rng_key key{1000 + step, i};
    if (n.type == dtype::i64) {
      auto& v = b.ids[n.name];
      for (std::size_t k = 0; k < n.out.size(); ++k)
        v.push_back(static_cast<std::int64_t>(uniform01(key, k) * double(id_limit)));
    } else {
      auto& v = b.values[n.name];
      for (std::size_t k = 0; k < n.out.size(); ++k)
        v.push_back(static_cast<T>(2.0 * uniform01(key, k) - 1.0));
    }
  }
  return b;
}

template <class T>
struct result {
  std::vector<double> losses;
  std::map<std::string, std::vector<T>> params;
};

// Training steps per run unless a caller asks for fewer (a slow backend). Every step takes the
// same path (optimizer state from the second on): 6 check as much as 10 did, in 60 % of the
// suite's time for these tests.
inline constexpr std::size_t default_steps = 6;
inline constexpr double clip = 0.5;

template <class T>
result<T> single(const graph::graph& g, std::size_t id_limit, std::size_t steps) {
  exec::executor<T> ex(g, 7);
  exec::sgd opt(0.05, 0.9);
  result<T> r;
  for (std::size_t s = 0; s < steps; ++s) {
    const auto b = data_for<T>(g, s, id_limit);
    for (const auto& [name, v] : b.values)
      ex.set_input(name, std::span<const T>(v));
    for (const auto& [name, v] : b.ids)
      ex.set_input(name, std::span<const std::int64_t>(v));
    ex.set_step(s);
    r.losses.push_back(static_cast<double>(ex.forward()));
    ex.backward();
    exec::clip_grad_norm(ex, clip);
    opt.step(ex);
  }
  for (graph::node_id p : g.parameters())
    r.params[g[p].name].assign(ex.value(p).begin(), ex.value(p).end());
  return r;
}

// The step program the simulator prices is the one every rank ran: the names of the
// instructions in the traced step, in the order each rank recorded them, equal the simulated
// list (same plan, bucket size, element type and recomputation; collective).
template <class T, class Comm, class B>
void check_program_ran(const graph::graph& g, const synth::plan& p,
                       exec::distributed_executor<T, Comm, B>& dx, bool recompute) {
  const nlohmann::json t = dx.collect_trace();
  if (!t.contains("traceEvents"))
    return; // (rank 0 checks)
  const cluster c = make_cluster(p.device_names.size(), 1e9);
  const synth::cost_model m(g, c, synth::segment_map(g, p.segments));
  sim::options so;
  so.bucket_bytes = static_cast<double>(dx.bucket_bytes());
  so.element_bytes = sizeof(T);
  so.recompute = recompute;
  so.names = true;
  const std::vector<std::string> priced = sim::simulate(p, m, so).program;
  std::map<int, std::vector<std::string>> ran;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "X" && e.contains("args") && e["args"].contains("instruction"))
      ran[e["pid"].get<int>()].push_back(e["name"].get<std::string>());
  INFO(p.strategy << ": " << priced.size() << " instructions priced");
  CHECK(ran.size() == p.device_names.size());
  CHECK(priced.size() == dx.step_program().code.size());
  for (const auto& [rank, names] : ran) {
    INFO("rank " << rank);
    CHECK(names == priced);
  }
}

// `B`: the backend the rank's tensors live in (a device-like one stages its collectives over
// MPI, or moves them directly with a device communicator `Comm`).
template <class T, class B = exec::host_backend, class Comm = mpi_communicator>
result<T> distributed(const graph::graph& g, const synth::plan& p, Comm& comm, std::size_t id_limit,
                      std::size_t steps, bool recompute = false) {
  exec::distributed_executor<T, Comm, B> dx(g, p, comm, 7);
  if (recompute) // the blocks' inner values made again in the backward
    CHECK(dx.recompute() > 0);
  // Buckets of a few gradients each: many all-reduces in flight during the backward, started
  // and completed at different points (the default size puts these small models in one).
  dx.set_bucket_bytes(256);
  if (p.strategy.ends_with("+fsdp")) {
    // FSDP's gathered copies share one buffer (each lives from its gather to its last reader,
    // and is gathered again for the backward): less than all of them at once.
    const program::local_program& prog = dx.program();
    std::size_t all = 0;
    for (graph::node_id i = 0; i < prog.local.size(); ++i)
      if (prog.transfer_of[i] &&
          prog.transfers[*prog.transfer_of[i]].what.kind == synth::transfer_kind::all_gather &&
          g[prog.global[i]].kind == graph::op::parameter)
        all += prog.local[i].out.size() * sizeof(T);
    CHECK(dx.gathered_parameter_copies() > 0);
    CHECK(dx.gathered_parameter_bytes() < all);
    // ... and no more than the plan's memory counts for them.
    const cluster c = make_cluster(static_cast<std::size_t>(comm.size()), 1e9);
    const synth::cost_model m(g, c, synth::segment_map(g, synth::segment_policy::one));
    CHECK(static_cast<double>(dx.gathered_parameter_bytes()) <=
          synth::gathered_parameter_peak(p.steps, m));
  }
  exec::sgd opt(0.05, 0.9);
  result<T> r;
  for (std::size_t s = 0; s < steps; ++s) {
    const auto b = data_for<T>(g, s, id_limit);
    for (const auto& [name, v] : b.values)
      dx.set_input(name, std::span<const T>(v));
    for (const auto& [name, v] : b.ids)
      dx.set_input(name, std::span<const std::int64_t>(v));
    dx.set_step(s);
    if (s + 1 == steps)
      dx.start_trace(); // the last step: its instructions, checked below
    r.losses.push_back(static_cast<double>(dx.forward()));
    dx.backward();
    dx.clip_grad_norm(clip);
    dx.update(opt);
  }
  check_program_ran(g, p, dx, recompute);
  for (graph::node_id q : g.parameters())
    r.params[g[q].name] = dx.gather(g[q].name);
  return r;
}

template <class T>
void check_same(const result<T>& got, const result<T>& want, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s) {
    INFO("step " << s << ": " << got.losses[s] << " vs " << want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= tol * std::abs(want.losses[s]));
  }
  for (const auto& [name, w] : want.params) {
    const auto& v = got.params.at(name);
    REQUIRE(v.size() == w.size());
    double scale = 0.0;
    for (T x : w)
      scale = std::max(scale, std::abs(static_cast<double>(x)));
    double worst = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(v[i]) - static_cast<double>(w[i])));
    INFO("parameter " << name << ": max difference " << worst << " at scale " << scale);
    CHECK(worst <= tol * std::max(scale, 1e-3));
  }
}

// `base` (DP-CP) with every eligible weight gradient by SFB instead of all-reduce.
inline synth::plan sfb_of(const graph::graph& g, synth::plan sfb) {
  sfb.strategy += "+sfb";
  for (synth::plan_step& s : sfb.steps)
    for (synth::transfer& t : s.transfers)
      if ((s.kind == graph::op::linear || s.kind == graph::op::matmul) &&
          t.kind == synth::transfer_kind::load && t.tensor == g[s.node].inputs[1] &&
          t.to.is_replicated() && s.rule.in[0].is_split() &&
          s.rule.in[0].dim() + 1 < g[g[s.node].inputs[0]].out.rank())
        t.sfb = true;
  return sfb;
}

// `base` with every replicated parameter load kept split along the parameter's largest dimension
// and all-gathered for use (FSDP).
inline synth::plan fsdp_of(const graph::graph& g, synth::plan fsdp) {
  fsdp.strategy += "+fsdp";
  for (synth::plan_step& s : fsdp.steps) {
    std::vector<synth::transfer> moved;
    for (const synth::transfer& t : s.transfers) {
      const auto& dims = g[t.tensor].out.dims;
      if (t.kind != synth::transfer_kind::load || g[t.tensor].kind != graph::op::parameter ||
          !t.to.is_replicated() || t.sfb) {
        moved.push_back(t);
        continue;
      }
      const auto d =
          static_cast<std::size_t>(std::max_element(dims.begin(), dims.end()) - dims.begin());
      const placement at = placement::split_along(d);
      moved.push_back({synth::transfer_kind::load, t.tensor, at, at, t.algorithm, false});
      moved.push_back(
          {synth::transfer_kind::all_gather, t.tensor, at, t.to, uneven_algorithm::native, false});
    }
    s.transfers = std::move(moved);
  }
  return fsdp;
}

// Every plan strategy at every ratio vector for this rank count.
// What the plans of a model must exercise on more than one rank (the default: a model with biased
// linear layers and a vocabulary).
inline const std::vector<std::string> default_must = {
    "all_gather", "reduce_scatter", "linear:split->partial",
    "bias-once",  "vocab-parallel", "load+sfb",
    "fsdp"};

// A plan made on rank 0 and sent to the others as its JSON (what the trainer does with a cached
// plan): one search per model instead of one per rank, which on 2 cores at 3 ranks ran three
// searches on two cores. That every rank would find the same plan is unit.synth's ("synthesis
// is ... deterministic") and lowering's agreement check's to show.
template <class Comm, class Make>
synth::plan from_rank0(Comm& comm, const graph::graph& g, Make&& make) {
  std::string text;
  if (comm.rank() == 0)
    text = synth::to_json(make()).dump();
  auto size = static_cast<std::uint64_t>(text.size());
  comm.broadcast(std::span<std::uint64_t>(&size, 1), 0);
  text.resize(static_cast<std::size_t>(size));
  comm.broadcast(std::span<char>(text), 0);
  return synth::plan_from_json(nlohmann::json::parse(text), g, "the plan from rank 0");
}

template <class T, class B = exec::host_backend, class Comm = mpi_communicator>
void equivalence(const std::string& model, const graph::graph& g, std::size_t id_limit, double tol,
                 double bandwidth, const std::vector<std::string>& must_use = default_must,
                 std::size_t steps = default_steps) {
  Comm comm;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto want = single<T>(g, id_limit, steps);
  const cluster c = make_cluster(n, bandwidth);
  std::vector<synth::plan> plans;
  plans.push_back(from_rank0(comm, g, [&] { return synth::synthesize(g, c, {}, model); }));
  // On a fast link the synthesizer prefers data parallelism (and SFB where it pays).
  plans.push_back(
      from_rank0(comm, g, [&] { return synth::synthesize(g, make_cluster(n, 1e12), {}, model); }));
  for (auto b : {synth::baseline::dp_ev, synth::baseline::dp_cp, synth::baseline::tp})
    plans.push_back(from_rank0(comm, g, [&] { return synth::make_baseline(g, c, b, {}, model); }));
  // DP-CP with every eligible weight gradient by SFB instead of all-reduce.
  plans.push_back(sfb_of(g, plans[3]));
  // DP-CP with every replicated parameter kept split and gathered for use (FSDP): the
  // instructions the search emits when memory demands it (unit.synth checks that it does;
  // synthesizing here would add a search per model to the suite's time).
  plans.push_back(fsdp_of(g, plans[3]));
  std::vector<std::vector<double>> ratios = {std::vector<double>(n, 1.0 / double(n))};
  if (n == 2)
    ratios.push_back({0.75, 0.25});
  if (n == 3) {
    ratios.push_back({5.0 / 9, 3.0 / 9, 1.0 / 9});
    ratios.push_back({0.5, 0.0, 0.5}); // rank 1 holds zero-length shards
  }
  // What the plans exercise (the test is only as good as the instructions it runs).
  std::set<std::string> used;
  for (const synth::plan& p : plans)
    for (const synth::plan_step& s : p.steps) {
      if (s.rule.kind != graph::rule::family::replicated)
        used.insert(std::string(graph::name(s.kind)) + ":" +
                    (s.rule.kind == graph::rule::family::split ? "split" : "linear") +
                    (s.rule.out.is_partial() ? "->partial" : ""));
      if (s.rule.vocab_parallel)
        used.insert("vocab-parallel");
      if (s.rule.bias_once)
        used.insert("bias-once");
      for (const synth::transfer& t : s.transfers)
        used.insert(std::string(synth::name(t.kind)) + (t.sfb ? "+sfb" : ""));
      for (std::size_t k = 0; k + 1 < s.transfers.size(); ++k)
        if (s.transfers[k].kind == synth::transfer_kind::load &&
            g[s.transfers[k].tensor].kind == graph::op::parameter && s.transfers[k].to.is_split() &&
            s.transfers[k + 1].tensor == s.transfers[k].tensor)
          used.insert("fsdp");
    }
  std::string list;
  for (const auto& u : used)
    list += u + " ";
  if (comm.rank() == 0)
    std::printf("%s on %zu ranks exercises: %s\n", model.c_str(), n, list.c_str());
  if (n > 1)
    for (const std::string& must : must_use) {
      INFO(must);
      CHECK(used.count(must) == 1);
    }
  for (const synth::plan& base : plans)
    for (const auto& r : ratios) {
      // The FSDP plan's instructions are the others' (a split load, a gather): it runs at the
      // last ratio vector only (uneven, or with an empty shard), to keep the suite's time.
      if (base.strategy == "dp-cp+fsdp" && &r != &ratios.back())
        continue;
      synth::plan p = base;
      for (auto& seg : p.ratios)
        seg = r;
      std::string what = model + " " + p.strategy + " at";
      for (double x : r)
        what += " " + std::to_string(x);
      check_same(distributed<T, B, Comm>(g, p, comm, id_limit, steps), want, tol, what);
    }
}

} // namespace hspmd::test
