#pragma once
// Measuring a cluster file instead of writing it by hand (hspmd-profile, tools/profile.cpp).
//
// Collective over a host communicator: every rank measures its own device and the ranks
// measure their links and collectives together; every rank returns the same `cluster`:
//   - speed: the rate of a probe training step on this rank (forward, backward and optimizer of
//     a small transformer, `profile_probe`): its FLOPs over its measured time, which is what the
//     cost model divides FLOPs by. GEMM rates in f32 and f64 (n = 512) are measured too and
//     reported beside it (a GEMM runs faster than a whole step, which also normalizes, adds and
//     moves memory).
//   - rates per op class (device_spec::rates): the same probe step's GEMM, elementwise and
//     softmax nodes' FLOPs over their measured seconds, and the optimizer's (train::class_rates),
//     so the cost model prices each op at what its class really runs at on this device.
//   - node: ranks with the same host name (given by the caller) share a node id, in order of
//     first appearance.
//   - memory: what the caller says this rank may use (its node's available memory over its
//     ranks there).
//   - links: ping-pong between rank 0 and the first rank on its node (intra) and on another node
//     (inter): latency from 8-byte messages (half the round trip), bandwidth from 4 MiB ones.
//   - collectives: `calibrate_collectives`, and the share of an all-reduce hidden behind compute
//     (`measure_overlap`).
// With a hand-written cluster to merge, its names, kinds, nodes, slowdowns, 16-bit rates and
// description stay, and the measured numbers replace the rest (a device's speed divided by its
// emulated slowdown, as the file format defines it).

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/comm/calibrate.hpp>
#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/profile.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::train {

/// What one rank measured of its own device.
struct device_measurement {
  double training_speed = 0.0;                ///< flop/s of the probe step
  double gemm_f32 = 0.0;                      ///< flop/s of a 512^3 float GEMM
  double gemm_f64 = 0.0;                      ///< flop/s of a 512^3 double GEMM
  std::array<double, op_class_count> rates{}; ///< flop/s per op class in the probe step
};

/// The probe model whose step rate becomes a device's speed: BERT with 2 layers, hidden 256,
/// FFN 1024, 4 heads, sequence 64, vocabulary 2000, batch 8.
[[nodiscard]] inline graph::graph profile_probe() {
  models::model_options o;
  o.layers = 2;
  o.hidden = 256;
  o.ffn = 1024;
  o.heads = 4;
  o.seq = 64;
  o.vocab = 2000;
  return models::trace_model<float>("bert", o, 8);
}

namespace detail {

template <std::floating_point T>
[[nodiscard]] double gemm_rate(std::size_t n, int repetitions) {
  host_backend be;
  auto a = be.allocate<T>(n * n);
  auto b = be.allocate<T>(n * n);
  auto c = be.allocate<T>(n * n);
  for (std::size_t i = 0; i < n * n; ++i) {
    a.data()[i] = static_cast<T>(static_cast<double>(i % 7) * 0.1);
    b.data()[i] = static_cast<T>(static_cast<double>(i % 5) * 0.1);
  }
  double best = 0.0;
  for (int r = 0; r <= repetitions; ++r) { // the first call warms up
    const auto t0 = std::chrono::steady_clock::now();
    be.gemm(transpose::no, transpose::no, n, n, n, T{1}, a.data(), n, b.data(), n, T{0}, c.data(),
            n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0 && s > 0.0)
      best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s);
  }
  return best;
}

} // namespace detail

/// Measures this rank's device (not collective): the probe step's rate and GEMM rates.
[[nodiscard]] inline device_measurement measure_device(int repetitions = 3) {
  device_measurement m;
  const graph::graph g = profile_probe();
  profile_options po;
  po.repetitions = static_cast<std::size_t>(std::max(1, repetitions));
  const synth::compute_profile p = measure_compute<float>(g, 1e9, po);
  double seconds = p.optimizer_seconds_per_element * static_cast<double>([&] {
                     std::size_t n = 0;
                     for (auto id : g.parameters())
                       n += g[id].out.size();
                     return n;
                   }());
  for (double s : p.seconds)
    seconds += s;
  const auto cost = graph::total_cost(g);
  m.training_speed = seconds > 0.0 ? (cost.forward_flops + cost.backward_flops) / seconds : 0.0;
  m.rates = class_rates(g, p);
  m.gemm_f32 = detail::gemm_rate<float>(512, repetitions);
  m.gemm_f64 = detail::gemm_rate<double>(512, repetitions);
  return m;
}

/// Collective: measures the cluster (see the file comment). `host` names this rank's node;
/// `memory_bytes` is what this rank may use; `merge` (optional) is a hand-written cluster of
/// as many devices as ranks whose topology stays; `repetitions` timed runs per measurement
/// (after a warm-up). Every rank returns the same cluster.
template <class Comm>
[[nodiscard]] cluster
measure_cluster(Comm& comm, const std::string& host, std::uint64_t memory_bytes,
                const std::optional<cluster>& merge = std::nullopt,
                std::vector<device_measurement>* measured = nullptr, int repetitions = 3) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  if (merge && merge->size() != n)
    throw config_error(merge->source + ": field devices",
                       "describes " + std::to_string(merge->size()) + " device(s) but " +
                           std::to_string(n) + " ranks measure",
                       "launch one rank per device of the file (mpirun -np " +
                           std::to_string(merge->size()) + ")");
  // Node ids from host names (fixed 64-byte records; longer names are cut).
  constexpr std::size_t name_len = 64;
  std::vector<char> mine(name_len, '\0');
  std::copy_n(host.begin(), std::min(host.size(), name_len - 1), mine.begin());
  std::vector<char> hosts(name_len * n);
  comm.all_gather_v(std::span<const char>(mine), std::span<char>(hosts),
                    std::vector<std::size_t>(n, name_len));
  std::vector<std::string> names;
  std::vector<std::int64_t> node(n);
  for (std::size_t r = 0; r < n; ++r) {
    const std::string h(hosts.data() + r * name_len);
    const auto it = std::find(names.begin(), names.end(), h);
    node[r] = it - names.begin();
    if (it == names.end())
      names.push_back(h);
  }
  // One device at a time, the others waiting: ranks sharing cores do not disturb each other.
  constexpr std::size_t per = 3 + op_class_count;
  std::vector<double> values(per * n, 0.0);
  for (std::size_t r = 0; r < n; ++r) {
    comm.barrier();
    if (r == me) {
      const device_measurement d = measure_device(repetitions);
      values[per * r] = d.training_speed;
      values[per * r + 1] = d.gemm_f32;
      values[per * r + 2] = d.gemm_f64;
      std::copy(d.rates.begin(), d.rates.end(),
                values.begin() + static_cast<std::ptrdiff_t>(per * r + 3));
    }
  }
  comm.all_reduce(std::span<double>(values), reduce_op::sum);
  // What ran each rank's GEMMs (exec/backends/blas.hpp), as fixed records.
  constexpr std::size_t blas_len = 96;
  std::vector<char> my_blas(blas_len, '\0');
  {
    const auto& b = blas::ensure();
    const std::string text = b.library + ", kernels " + (b.core.empty() ? "?" : b.core);
    std::copy_n(text.begin(), std::min(text.size(), blas_len - 1), my_blas.begin());
  }
  std::vector<char> blas_texts(blas_len * n);
  comm.all_gather_v(std::span<const char>(my_blas), std::span<char>(blas_texts),
                    std::vector<std::size_t>(n, blas_len));
  std::vector<device_measurement> got(n);
  for (std::size_t r = 0; r < n; ++r) {
    got[r] = {values[per * r], values[per * r + 1], values[per * r + 2], {}};
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(per * r + 3), op_class_count,
                got[r].rates.begin());
  }
  std::vector<double> mem(n, 0.0);
  mem[me] = static_cast<double>(memory_bytes);
  comm.all_reduce(std::span<double>(mem), reduce_op::sum);
  // Links: rank 0 with the first rank on its node, and with the first on another node.
  const auto ping = [&](std::size_t peer, std::size_t bytes) {
    std::vector<char> buf(bytes, 'x');
    constexpr int rounds = 10;
    double best = 1e30;
    for (int k = 0; k <= rounds; ++k) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      if (me == 0) {
        comm.send(std::span<const char>(buf), static_cast<int>(peer), 11);
        comm.recv(std::span<char>(buf), static_cast<int>(peer), 12);
      } else if (me == peer) {
        comm.recv(std::span<char>(buf), 0, 11);
        comm.send(std::span<const char>(buf), 0, 12);
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2.0;
      if (k > 0)
        best = std::min(best, s);
    }
    std::array<double, 1> v{me == 0 ? best : 0.0};
    comm.all_reduce(std::span<double>(v), reduce_op::sum);
    return v[0];
  };
  const auto link_to = [&](std::size_t peer) {
    const double latency = ping(peer, 8);
    const double big = ping(peer, std::size_t{4} << 20U);
    link_spec l;
    l.latency = latency;
    l.bandwidth = static_cast<double>(std::size_t{4} << 20U) / std::max(big - latency, 1e-9);
    return l;
  };
  cluster c = merge ? *merge : cluster{};
  if (!merge) {
    c.name = "measured";
    c.devices.resize(n);
    for (std::size_t r = 0; r < n; ++r) {
      c.devices[r].name = "rank" + std::to_string(r);
      c.devices[r].kind = "cpu";
      c.devices[r].node = node[r];
    }
  }
  std::optional<std::size_t> same;
  std::optional<std::size_t> other;
  for (std::size_t r = 1; r < n; ++r) {
    if (node[r] == node[0] && !same)
      same = r;
    if (node[r] != node[0] && !other)
      other = r;
  }
  c.intra_node = same ? link_to(*same) : c.intra_node;
  if (other)
    c.inter_node = link_to(*other);
  if (!same && !merge) { // one rank per node: a shared-memory default inside nodes
    c.intra_node.bandwidth = 1e10;
    c.intra_node.latency = 1e-6;
  }
  std::string text = "measured by hspmd-profile:";
  for (std::size_t r = 0; r < n; ++r) {
    device_spec& d = c.devices[r];
    const double slow = std::max(1.0, d.slowdown);
    d.speed = got[r].training_speed / slow;
    // A class the probe could not time (none is expected) leaves the device without rates.
    const bool all = std::ranges::all_of(got[r].rates, [](double x) { return x > 0.0; });
    for (std::size_t k = 0; k < op_class_count; ++k)
      d.rates[k] = all ? got[r].rates[k] / slow : 0.0;
    d.memory = static_cast<std::uint64_t>(mem[r]);
    // The MFU peak: the float GEMM's rate (stretched like the rest of an emulated device).
    d.peak = got[r].gemm_f32 / slow;
    d.blas = std::string(blas_texts.data() + r * blas_len);
    // The GEMM 512 rates are not priced: f32 is the device's "peak" (MFU), and the description
    // says both while it stays within the format's 1000 characters.
    char line[120];
    std::snprintf(line, sizeof line, " %s GEMM 512 f32 %.3g GF/s, f64 %.3g GF/s;", d.name.c_str(),
                  got[r].gemm_f32 / 1e9, got[r].gemm_f64 / 1e9);
    if (text.size() + std::string_view(line).size() < 850)
      text += line;
    else if (text.back() != '.')
      text += " (more in hspmd-profile's output).";
  }
  // The merged file's own description first; the measured summary where the format's 1000
  // characters leave room for it.
  c.description = !merge || merge->description.empty() ? text
                  : merge->description.size() + 1 + text.size() <= 1000
                      ? merge->description + " " + text
                      : merge->description;
  calibration_options co;
  co.repetitions = std::max(1, repetitions);
  c.set_collective_costs(calibrate_collectives(comm, co));
  c.overlap = measure_overlap(comm);
  if (measured != nullptr)
    *measured = got;
  return c;
}

} // namespace hspmd::train
