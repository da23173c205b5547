#pragma once
// Measuring what a graph's compute really takes on this device, for the cost model
// (synth::compute_profile): a few training steps of the whole graph on one process, timed per
// node, forward and backward, plus the optimizer step with gradient clipping per parameter
// element. The time a step spends outside the nodes (zeroing gradients, feeding inputs) is
// shared out over the nodes in proportion to their time, so the profile adds up to the step.
//
//     auto prof = train::measure_compute<float>(g, cluster.devices[0].speed);
//     synth::synth_options opt;  opt.profile = prof;
//     auto plan = synth::synthesize(g, cluster, opt);
//
// `measure_compute_on_rank0` does the same in a job: rank 0 measures, every rank receives the
// same profile (so every rank synthesizes the same plan).
//
// A rank of a data-parallel plan runs each op on part of the rows, and an op's time is not
// proportional to its rows: a layer reads its whole weight for one row or many, and every call
// has a fixed cost (VGG-19's classifier at width 0.25 on this machine: a step of 8 samples takes
// 374 ms, of 16 samples 512 ms). Given the model traced at half the batch too,
// `with_fixed_shares` fits each node's time to fixed + per-row from the two measurements, and
// the cost model keeps the fixed share whole on every device that divides the node's rows
// (synth::compute_profile::fixed).
//
// On a device backend (`measure_compute<T, B>(g, speed, opt, backend)`) the nodes are timed by
// the backend's `timed` (events on its stream) and the step's ends wait for the device, so the
// profile is the device's; `opt.precision` measures a mixed-precision run's kernels.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/comm/communicator.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/cost.hpp>
#include <hspmd/train/namespace.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::train {

/// How `measure_compute` measures.
struct profile_options {
  std::size_t repetitions = 3; ///< timed steps after one warm-up; each node's median counts
  std::uint64_t seed = 1;      ///< parameters and input values
  double slowdown = 1.0; ///< the measured device's emulated slowdown: times are stretched by it
  exec::precision precision = exec::precision::f32; ///< the run's precision (kernels/precision.hpp)
};

/// Measures `g`'s compute on this process; `speed` is the flop/s the cluster file gives the
/// device it runs on. Inputs get seeded values in [-1, 1] (integer inputs: 0, a valid index of
/// every embedding and label).
/// `layouts`: one per node where `g` is one rank's program (program/lower.hpp), or none.
template <std::floating_point T, backend B = host_backend>
[[nodiscard]] synth::compute_profile
measure_compute(const graph::graph& g, double speed, const profile_options& opt = {}, B device = {},
                std::vector<program::node_layout> layouts = {}) {
  using clock = std::chrono::steady_clock;
  if (!(speed > 0.0) || opt.repetitions == 0)
    throw config_error("measure_compute", "speed must be positive and repetitions at least 1",
                       "pass the device's flop/s from the cluster file");
  executor<T, B> ex(g, opt.seed, std::move(layouts), std::move(device));
  ex.set_precision(opt.precision);
  for (graph::node_id i = 0; i < g.size(); ++i)
    if (g[i].kind == graph::op::input && g[i].type != dtype::i64) {
      std::vector<T> v(g[i].out.size());
      for (std::size_t k = 0; k < v.size(); ++k)
        v[k] = static_cast<T>(std::sin(0.7 * static_cast<double>(k) + static_cast<double>(i)));
      ex.value_from_host(i, std::span<const T>(v));
    }
  adam timing_adam(0.0); // the update's cost; a zero rate keeps the values stable
  std::size_t elements = 0;
  for (graph::node_id id : g.parameters())
    elements += g[id].out.size();

  std::vector<std::vector<double>> node(g.size());
  std::vector<std::vector<double>> node_forward(g.size());
  std::vector<double> outside;
  std::vector<double> update;
  for (std::size_t rep = 0; rep <= opt.repetitions; ++rep) {
    ex.set_profiling(true);
    ex.set_step(rep);
    const auto start = clock::now();
    (void)ex.forward();
    ex.backward();
    ex.backend().synchronize(); // a device's queued backward counts before the optimizer
    const auto mid = clock::now();
    (void)clip_grad_norm(ex, 1.0);
    timing_adam.step(ex);
    ex.backend().synchronize();
    const auto end = clock::now();
    ex.set_profiling(false);
    if (rep == 0)
      continue; // warm-up: first touches of every buffer
    double inside = 0.0;
    for (graph::node_id i = 0; i < g.size(); ++i) {
      const auto& e = ex.node_profile()[i];
      node[i].push_back(e.forward + e.backward);
      node_forward[i].push_back(e.forward);
      inside += e.forward + e.backward;
    }
    outside.push_back(std::max(0.0, std::chrono::duration<double>(mid - start).count() - inside));
    update.push_back(std::chrono::duration<double>(end - mid).count());
  }
  const auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  synth::compute_profile p;
  p.speed = speed;
  double inside = 0.0;
  for (graph::node_id i = 0; i < g.size(); ++i) {
    p.seconds.push_back(median(node[i]));
    inside += p.seconds.back();
    const double fwd = median(node_forward[i]);
    p.forward.push_back(p.seconds.back() > 0.0 ? std::clamp(fwd / p.seconds.back(), 0.0, 1.0)
                                               : synth::forward_share);
  }
  const double stretch = (inside > 0.0 ? 1.0 + median(outside) / inside : 1.0) * opt.slowdown;
  for (double& s : p.seconds)
    s *= stretch;
  p.optimizer_seconds_per_element =
      elements > 0 ? median(update) * opt.slowdown / static_cast<double>(elements) : 0.0;
  return p;
}

/// Whether `other` is `g` traced at another batch: the same ops in the same order, reading the
/// same inputs, with the same parameter shapes.
[[nodiscard]] inline bool same_structure(const graph::graph& g, const graph::graph& other) {
  if (g.size() != other.size())
    return false;
  for (graph::node_id i = 0; i < g.size(); ++i)
    if (g[i].kind != other[i].kind || g[i].inputs != other[i].inputs ||
        (g[i].kind == graph::op::parameter && g[i].out.dims != other[i].out.dims))
      return false;
  return true;
}

/// Sets `full.fixed` (per node, the share of its time that does not shrink with the rows) from
/// `part`, the same model measured at `rows` (in (0, 1)) of the batch, e.g. half: time = fixed +
/// per-row * rows through both points, the fixed share clamped to [0, 1] (a node measured no
/// faster on fewer rows, noise, gets 1; one faster than in proportion, 0).
inline void with_fixed_shares(synth::compute_profile& full, const synth::compute_profile& part,
                              double rows = 0.5) {
  if (!(rows > 0.0 && rows < 1.0))
    throw config_error("with_fixed_shares", "rows must lie in (0, 1)",
                       "measure the second profile on fewer rows than the first");
  if (part.seconds.size() != full.seconds.size())
    throw config_error("with_fixed_shares",
                       "the second profile has " + std::to_string(part.seconds.size()) +
                           " node times for " + std::to_string(full.seconds.size()) + " nodes",
                       "measure both profiles on the same model (train::same_structure)");
  full.fixed.assign(full.seconds.size(), 0.0);
  for (std::size_t i = 0; i < full.seconds.size(); ++i)
    if (full.seconds[i] > 0.0)
      full.fixed[i] = std::clamp(
          1.0 - (full.seconds[i] - part.seconds[i]) / ((1.0 - rows) * full.seconds[i]), 0.0, 1.0);
}

/// The rates per op class (flop/s, index `op_class`) that profile `p` of `g` shows: each class's
/// FLOPs (graph/ops.hpp's count, forward + backward) over its nodes' measured seconds, and the
/// optimizer's FLOPs per element over its seconds per element. A class without FLOPs or time in
/// `g` gets 0 (unmeasured).
[[nodiscard]] inline std::array<double, op_class_count>
class_rates(const graph::graph& g, const synth::compute_profile& p) {
  std::array<double, op_class_count> flops{};
  std::array<double, op_class_count> seconds{};
  for (graph::node_id i = 0; i < g.size() && i < p.seconds.size(); ++i) {
    const auto k = static_cast<std::size_t>(synth::op_class_of(g[i].kind));
    const graph::node_cost c = graph::cost_of(g, i);
    flops[k] += c.forward_flops + c.backward_flops;
    seconds[k] += p.seconds[i];
  }
  const auto opt = static_cast<std::size_t>(op_class::optimizer);
  flops[opt] = synth::optimizer_flops_per_element;
  seconds[opt] = p.optimizer_seconds_per_element;
  std::array<double, op_class_count> rates{};
  for (std::size_t k = 0; k < op_class_count; ++k)
    rates[k] = flops[k] > 0.0 && seconds[k] > 0.0 ? flops[k] / seconds[k] : 0.0;
  return rates;
}

/// Collective: rank 0 measures `g` (on its device, rated `speed` flop/s, with its emulated
/// `slowdown`) while the others wait; every rank returns rank 0's profile.
/// `measure`: how rank 0 measures (a device engine's `measure`, train/engine.hpp); the host
/// executor when empty. `part`: the model traced at `rows` of the batch (`same_structure` as
/// `g`), measured too for the fixed shares (`with_fixed_shares`); none, or another structure:
/// none. `by_weight`: a plan that divides parameters, measured at its pieces on the host for the
/// weight-fixed shares (`with_weight_fixed_shares`); none: none.
template <std::floating_point T, class Comm>
requires communicator<Comm, double>
[[nodiscard]] synth::compute_profile measure_compute_on_rank0(
    const graph::graph& g, double speed, Comm& comm, profile_options opt = {},
    const std::function<synth::compute_profile(const graph::graph&, double,
                                               const profile_options&)>& measure = {},
    const graph::graph* part = nullptr, double rows = 0.5, const synth::plan* by_weight = nullptr) {
  std::vector<double> buf(4 * g.size() + 3 + op_class_count, 0.0);
  const auto forward_at = static_cast<std::ptrdiff_t>(g.size() + 3 + op_class_count);
  const auto fixed_at = forward_at + static_cast<std::ptrdiff_t>(g.size());
  const auto weight_at = fixed_at + static_cast<std::ptrdiff_t>(g.size());
  if (comm.rank() == 0) {
    const auto measured = [&](const graph::graph& x) {
      return measure ? measure(x, speed, opt) : measure_compute<T>(x, speed, opt);
    };
    synth::compute_profile p = measured(g);
    if (part != nullptr && same_structure(g, *part))
      with_fixed_shares(p, measured(*part), rows);
    if (by_weight != nullptr && !measure) // (pieces are measured on the host)
      with_weight_fixed_shares<T>(p, g, *by_weight, opt);
    std::copy(p.seconds.begin(), p.seconds.end(), buf.begin());
    buf[g.size()] = p.optimizer_seconds_per_element;
    buf[g.size() + 1] = p.speed;
    buf[g.size() + 2] = p.gemm_speed;
    std::copy(p.rates.begin(), p.rates.end(),
              buf.begin() + static_cast<std::ptrdiff_t>(g.size() + 3));
    for (std::size_t i = 0; i < g.size(); ++i) // -1: not measured apart
      buf[static_cast<std::size_t>(forward_at) + i] = i < p.forward.size() ? p.forward[i] : -1.0;
    for (std::size_t i = 0; i < g.size(); ++i) // -1: no fixed shares
      buf[static_cast<std::size_t>(fixed_at) + i] = i < p.fixed.size() ? p.fixed[i] : -1.0;
    for (std::size_t i = 0; i < g.size(); ++i) // -2: no weight-fixed shares
      buf[static_cast<std::size_t>(weight_at) + i] =
          p.weight_fixed.empty() ? -2.0 : p.weight_fixed[i];
  }
  comm.broadcast(std::span<double>(buf), 0);
  synth::compute_profile p;
  p.seconds.assign(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(g.size()));
  p.optimizer_seconds_per_element = buf[g.size()];
  p.speed = buf[g.size() + 1];
  p.gemm_speed = buf[g.size() + 2];
  std::copy_n(buf.begin() + static_cast<std::ptrdiff_t>(g.size() + 3), op_class_count,
              p.rates.begin());
  if (g.size() > 0 && buf[static_cast<std::size_t>(forward_at)] >= 0.0)
    p.forward.assign(buf.begin() + forward_at,
                     buf.begin() + forward_at + static_cast<std::ptrdiff_t>(g.size()));
  if (g.size() > 0 && buf[static_cast<std::size_t>(fixed_at)] >= 0.0)
    p.fixed.assign(buf.begin() + fixed_at,
                   buf.begin() + fixed_at + static_cast<std::ptrdiff_t>(g.size()));
  if (g.size() > 0 && buf[static_cast<std::size_t>(weight_at)] >= -1.0)
    p.weight_fixed.assign(buf.begin() + weight_at,
                          buf.begin() + weight_at + static_cast<std::ptrdiff_t>(g.size()));
  return p;
}

namespace detail {
// Device d's program of plan p measured on this process (its ops at its lengths, transfers as
// placeholders). A vocabulary-parallel cross-entropy combines its rows' maxima and sums across
// the ranks, which one process cannot: it is timed as a cross-entropy of its piece; the
// combination is the rule's collectives, priced apart.
template <std::floating_point T>
[[nodiscard]] synth::compute_profile measure_piece(const program::local_program& prog,
                                                   const profile_options& opt) {
  std::vector<program::node_layout> layouts = prog.layouts;
  for (program::node_layout& l : layouts)
    l.vocab_parallel = false;
  return measure_compute<T>(prog.local, 1.0, opt, host_backend{}, std::move(layouts));
}
} // namespace detail

/// Sets `full.weight_fixed` (per node, the share of its time that does not shrink when its
/// weight is divided: a convolution split by output channels unfolds its whole input, a call
/// has a fixed cost) from `g` measured at device 0's pieces of `by_weight`, a plan of `g` over
/// two devices that divides parameters (a tensor-parallel baseline on two equal devices): for
/// each node whose rule there divides a parameter, time = fixed + per-column * share through
/// both points, share = device 0's part of that parameter, clamped to [0, 1]; -1 for the nodes
/// that plan keeps whole. `full` is `g` measured whole with the same options.
template <std::floating_point T>
void with_weight_fixed_shares(synth::compute_profile& full, const graph::graph& g,
                              const synth::plan& by_weight, const profile_options& opt = {}) {
  if (full.seconds.size() != g.size())
    throw config_error("with_weight_fixed_shares",
                       "the profile has " + std::to_string(full.seconds.size()) +
                           " node times for " + std::to_string(g.size()) + " nodes",
                       "measure the profile on this graph");
  const program::local_program prog = program::lower(g, by_weight, 0);
  const synth::compute_profile q = detail::measure_piece<T>(prog, opt);
  std::vector<const graph::rule*> rule(g.size(), nullptr);
  for (const synth::plan_step& st : by_weight.steps)
    rule[st.node] = &st.rule;
  full.weight_fixed.assign(g.size(), -1.0);
  for (graph::node_id i = 0; i < prog.local.size(); ++i) {
    const graph::node_id id = prog.global[i];
    const graph::node& n = g[id];
    if (prog.transfer_of[i] || rule[id] == nullptr || !(full.seconds[id] > 0.0))
      continue;
    for (std::size_t k = 0; k < n.inputs.size() && k < rule[id]->arity; ++k) {
      const graph::node& w = g[n.inputs[k]];
      if (!rule[id]->in[k].is_split() || w.kind != graph::op::parameter || w.out.size() == 0)
        continue;
      const double share = static_cast<double>(prog.local[prog.local[i].inputs[k]].out.size()) /
                           static_cast<double>(w.out.size());
      if (share > 0.0 && share < 1.0)
        full.weight_fixed[id] = std::clamp((q.seconds[i] - share * full.seconds[id]) /
                                               ((1.0 - share) * full.seconds[id]),
                                           0.0, 1.0);
      break;
    }
  }
}

/// The compute of plan `p` of `g` at every device's own pieces (sim::shard_times): each
/// device's program (program/lower.hpp: its ops at its lengths, transfers as placeholders) run on
/// this process, node by node, and its optimizer step; devices whose pieces have the same shapes
/// are measured once. The seconds are this device's (`opt.slowdown` stretches them like
/// `measure_compute`); the simulation converts them to each device's rate.
template <std::floating_point T>
[[nodiscard]] sim::shard_times measure_shards(const graph::graph& g, const synth::plan& p,
                                              const profile_options& opt = {}) {
  const std::size_t n = p.device_names.size();
  sim::shard_times out;
  out.seconds.assign(n, std::vector<double>(g.size(), -1.0));
  out.optimizer.assign(n, 0.0);
  std::map<std::vector<std::size_t>, std::size_t> measured; // piece shapes -> a device measured
  for (std::size_t d = 0; d < n; ++d) {
    const program::local_program prog = program::lower(g, p, d);
    std::vector<std::size_t> shapes;
    for (const graph::node& x : prog.local.nodes()) {
      shapes.insert(shapes.end(), x.out.dims.begin(), x.out.dims.end());
      shapes.push_back(0); // (a separator)
    }
    if (const auto it = measured.find(shapes); it != measured.end()) {
      out.seconds[d] = out.seconds[it->second];
      out.optimizer[d] = out.optimizer[it->second];
      continue;
    }
    measured.emplace(std::move(shapes), d);
    const synth::compute_profile q = detail::measure_piece<T>(prog, opt);
    std::size_t elements = 0;
    for (graph::node_id i = 0; i < prog.local.size(); ++i) {
      const graph::node& x = prog.local[i];
      if (x.kind == graph::op::parameter)
        elements += x.out.size();
      else if (x.kind != graph::op::input && !prog.transfer_of[i])
        out.seconds[d][prog.global[i]] = q.seconds[i];
    }
    out.optimizer[d] = q.optimizer_seconds_per_element * static_cast<double>(elements);
  }
  return out;
}

/// Collective: rank 0 measures `measure_shards(g, p, opt)` while the others wait; every rank
/// returns rank 0's measurement.
template <std::floating_point T, class Comm>
requires communicator<Comm, double>
[[nodiscard]] sim::shard_times measure_shards_on_rank0(const graph::graph& g, const synth::plan& p,
                                                       Comm& comm,
                                                       const profile_options& opt = {}) {
  const std::size_t n = p.device_names.size();
  std::vector<double> buf(n * (g.size() + 1), 0.0);
  if (comm.rank() == 0) {
    const sim::shard_times t = measure_shards<T>(g, p, opt);
    for (std::size_t d = 0; d < n; ++d) {
      std::copy(t.seconds[d].begin(), t.seconds[d].end(),
                buf.begin() + static_cast<std::ptrdiff_t>(d * g.size()));
      buf[n * g.size() + d] = t.optimizer[d];
    }
  }
  comm.broadcast(std::span<double>(buf), 0);
  sim::shard_times t;
  for (std::size_t d = 0; d < n; ++d) {
    const auto at = buf.begin() + static_cast<std::ptrdiff_t>(d * g.size());
    t.seconds.emplace_back(at, at + static_cast<std::ptrdiff_t>(g.size()));
    t.optimizer.push_back(buf[n * g.size() + d]);
  }
  return t;
}

} // namespace hspmd::train
