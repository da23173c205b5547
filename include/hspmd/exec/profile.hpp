#pragma once
// Measuring what a graph's compute really takes on this device, for the cost model
// (synth::compute_profile): a few training steps of the whole graph on one process, timed per
// node, forward and backward, plus the optimizer step with gradient clipping per parameter
// element. The time a step spends outside the nodes (zeroing gradients, feeding inputs) is
// shared out over the nodes in proportion to their time, so the profile adds up to the step.
//
//     auto prof = exec::measure_compute<float>(g, cluster.devices[0].speed);
//     synth::synth_options opt;  opt.profile = prof;
//     auto plan = synth::synthesize(g, cluster, opt);
//
// `measure_compute_on_rank0` does the same in a job: rank 0 measures, every rank receives the
// same profile (so every rank synthesizes the same plan).
//
// On a device backend (`measure_compute<T, B>(g, speed, opt, backend)`) the nodes are timed by
// the backend's `timed` (events on its stream) and the step's ends wait for the device, so the
// profile is the device's; `opt.precision` measures a mixed-precision run's kernels.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/comm/communicator.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/precision.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/synth/cost.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <span>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// How `measure_compute` measures.
struct profile_options {
  std::size_t repetitions = 3; ///< timed steps after one warm-up; each node's median counts
  std::uint64_t seed = 1;      ///< parameters and input values
  double slowdown = 1.0; ///< the measured device's emulated slowdown: times are stretched by it
  exec::precision precision = exec::precision::f32; ///< the run's precision (exec/precision.hpp)
};

/// Measures `g`'s compute on this process; `speed` is the flop/s the cluster file gives the
/// device it runs on. Inputs get seeded values in [-1, 1] (integer inputs: 0, a valid index of
/// every embedding and label).
template <std::floating_point T, backend B = host_backend>
[[nodiscard]] synth::compute_profile measure_compute(const graph::graph& g, double speed,
                                                     const profile_options& opt = {},
                                                     B device = {}) {
  using clock = std::chrono::steady_clock;
  if (!(speed > 0.0) || opt.repetitions == 0)
    throw config_error("measure_compute", "speed must be positive and repetitions at least 1",
                       "pass the device's flop/s from the cluster file");
  executor<T, B> ex(g, opt.seed, {}, std::move(device));
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
/// `measure`: how rank 0 measures (a device engine's `measure`, exec/engine.hpp); the host
/// executor when empty.
template <std::floating_point T, class Comm>
requires communicator<Comm, double>
[[nodiscard]] synth::compute_profile measure_compute_on_rank0(
    const graph::graph& g, double speed, Comm& comm, profile_options opt = {},
    const std::function<synth::compute_profile(const graph::graph&, double,
                                               const profile_options&)>& measure = {}) {
  std::vector<double> buf(2 * g.size() + 3 + op_class_count, 0.0);
  const auto forward_at = static_cast<std::ptrdiff_t>(g.size() + 3 + op_class_count);
  if (comm.rank() == 0) {
    const synth::compute_profile p =
        measure ? measure(g, speed, opt) : measure_compute<T>(g, speed, opt);
    std::copy(p.seconds.begin(), p.seconds.end(), buf.begin());
    buf[g.size()] = p.optimizer_seconds_per_element;
    buf[g.size() + 1] = p.speed;
    buf[g.size() + 2] = p.gemm_speed;
    std::copy(p.rates.begin(), p.rates.end(),
              buf.begin() + static_cast<std::ptrdiff_t>(g.size() + 3));
    for (std::size_t i = 0; i < g.size(); ++i) // -1: not measured apart
      buf[static_cast<std::size_t>(forward_at) + i] = i < p.forward.size() ? p.forward[i] : -1.0;
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
  return p;
}

} // namespace hspmd::exec
