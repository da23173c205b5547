#pragma once
// The cluster a job runs on: one device per rank (device i is rank i) and the links between
// them. Read from a cluster file (see docs/cluster-file.md and cluster_file.hpp).

#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd {

/// Classes of work a device runs at different rates (synth/cost.hpp maps each graph op to one):
/// GEMM-like products (matmul, linear, batched matmul, convolution); elementwise and
/// normalization ops and everything else that streams memory; softmax and cross-entropy (row
/// reductions with exponentials); the optimizer's update with clipping.
enum class op_class : std::uint8_t { gemm, elementwise, softmax, optimizer };
inline constexpr std::size_t op_class_count = 4;
/// The classes' names in cluster files and reports, in enum order.
inline constexpr std::array<std::string_view, op_class_count> op_class_names = {
    "gemm", "elementwise", "softmax", "optimizer"};

/// One rank's device.
struct device_spec {
  std::string name;         ///< unique within the cluster, e.g. "node0-v100.3"
  std::string kind;         ///< model, e.g. "V100"; informative
  double speed = 0.0;       ///< sustained flop/s for training math (after any slowdown)
  std::uint64_t memory = 0; ///< bytes usable for parameters, optimizer state and activations
  std::int64_t node = 0;    ///< devices with the same node id talk over the intra-node link
  double slowdown = 1.0;    ///< emulation only: compute is stretched by this factor (>= 1)
  /// Sustained flop/s of GEMMs with 16-bit operands and float accumulation (tensor cores), what
  /// a bf16 or f16 run's matrix products get; 0: none faster than `speed` (a CPU).
  double bf16_speed = 0.0;
  /// Peak flop/s of the device, what MFU is reported against (a float GEMM's on a CPU, which
  /// hspmd-profile measures; the data sheet's dense rate in the run's precision on a GPU); 0:
  /// unknown (a host rank then measures its own BLAS at start-up). Informative: never priced.
  double peak = 0.0;
  /// What ran the measured GEMMs ("OpenBLAS 0.3.21, kernels Cooperlake"), as hspmd-profile
  /// found it; informative.
  std::string blas;
  /// Measured flop/s per op class (index: `op_class`), FLOPs counted as graph/ops.hpp counts
  /// them (so a memory-bound class has a low rate), after any slowdown; all 0: none measured,
  /// every class runs at `speed`. hspmd-profile writes them; a cluster file gives all four for
  /// every device or for none.
  std::array<double, op_class_count> rates{};

  /// Whether the device has measured per-class rates.
  [[nodiscard]] bool has_rates() const noexcept { return rates[0] > 0.0; }

  /// The rate of work of class `c`: the measured class rate, else `speed`; GEMMs of a 16-bit
  /// run at `bf16_speed` where the device has one.
  [[nodiscard]] double rate(op_class c, bool sixteen_bit = false) const noexcept {
    if (c == op_class::gemm && sixteen_bit && bf16_speed > 0.0)
      return bf16_speed;
    const double r = rates[static_cast<std::size_t>(c)];
    return r > 0.0 ? r : speed;
  }

  /// The rate of GEMM-class work: `bf16_speed` in a 16-bit run where the device has one.
  [[nodiscard]] double gemm_speed(bool sixteen_bit) const noexcept {
    return rate(op_class::gemm, sixteen_bit);
  }

  /// Stretches the device's compute by `factor` (> 1: slower): every rate is divided by it.
  void slow_by(double factor) noexcept {
    speed /= factor;
    bf16_speed /= factor;
    for (double& r : rates)
      r /= factor;
  }

  friend bool operator==(const device_spec&, const device_spec&) = default;
};

/// A class of links: a collective's time is latency + bytes / bandwidth on its slowest link.
struct link_spec {
  double bandwidth = 0.0; ///< bytes per second, per direction
  double latency = 0.0;   ///< seconds per message

  friend bool operator==(const link_spec&, const link_spec&) = default;
};

/// Measured alpha-beta costs of one (collective, algorithm), from the cluster file's optional
/// "collectives" section (written by calibration or the profiler).
struct collective_cost_entry {
  collective op = collective::all_reduce;
  uneven_algorithm algorithm = uneven_algorithm::native; ///< `native` for collectives without
  cost_curve curve;

  friend bool operator==(const collective_cost_entry&, const collective_cost_entry&) = default;
};

/// Devices and links of a job.
struct cluster {
  std::string name;                    ///< short name, e.g. "hap-testbed"
  std::string description;             ///< free text
  std::vector<device_spec> devices;    ///< device i is rank i
  link_spec intra_node;                ///< between devices of one node
  std::optional<link_spec> inter_node; ///< between nodes; present when there are several
  std::vector<collective_cost_entry> collective_costs; ///< measured overrides of the defaults
  /// The fraction of a gradient all-reduce that runs hidden behind the backward pass where the
  /// backward leaves room for it (the cost model's overlap credit, synth/plan.hpp): 0, the
  /// default, prices every all-reduce in full; `--calibrate` measures it
  /// (`measure_overlap`, comm/calibrate.hpp).
  double overlap = 0.0;
  std::string source; ///< file it was read from (for messages; not compared)

  /// Number of devices (= ranks).
  [[nodiscard]] std::size_t size() const noexcept { return devices.size(); }

  /// Distinct node ids, ascending.
  [[nodiscard]] std::vector<std::int64_t> nodes() const {
    std::vector<std::int64_t> ids;
    for (const auto& d : devices)
      ids.push_back(d.node);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  }

  /// The link between devices `a` and `b` (intra-node when they share a node). Throws
  /// `config_error` when they do not and the cluster has no inter-node link.
  [[nodiscard]] const link_spec& link_between(std::size_t a, std::size_t b) const {
    if (devices.at(a).node == devices.at(b).node)
      return intra_node;
    if (!inter_node)
      throw config_error(source + ": field links.inter_node", "missing",
                         "a link between nodes, since devices span several nodes");
    return *inter_node;
  }

  /// The link every collective over all devices crosses: inter-node when there are several
  /// nodes, else intra-node.
  [[nodiscard]] const link_spec& bottleneck_link() const {
    return nodes().size() > 1 && inter_node ? *inter_node : intra_node;
  }

  /// Cost model of collectives over all devices: defaults from the bottleneck link's latency
  /// and bandwidth, replaced by the file's measured "collectives" entries where present.
  [[nodiscard]] collective_cost_model cost_model() const {
    const link_spec& l = bottleneck_link();
    auto m =
        collective_cost_model::from_link(static_cast<int>(devices.size()), l.latency, l.bandwidth);
    for (const auto& e : collective_costs)
      m.set(e.op, e.algorithm, e.curve);
    return m;
  }

  /// Takes every collective's cost curve from `m` (e.g. what `calibrate_collectives` measured),
  /// so that plans are priced by measurement; written out by `to_json` like any file entry.
  void set_collective_costs(const collective_cost_model& m) {
    collective_costs.clear();
    // The order a cluster file is read in, so that a written and re-read cluster compares
    // equal (barriers move no data: not a file entry).
    for (collective op :
         {collective::all_gather_v, collective::reduce_scatter_v, collective::all_reduce,
          collective::broadcast, collective::all_to_all_v}) {
      if (!has_algorithms(op))
        collective_costs.push_back(
            {op, uneven_algorithm::native, m.curve(op, uneven_algorithm::native)});
      else
        for (uneven_algorithm a : concrete_algorithms)
          collective_costs.push_back({op, a, m.curve(op, a)});
    }
  }

  /// Same content (the source file name is not compared).
  friend bool operator==(const cluster& a, const cluster& b) {
    return a.name == b.name && a.description == b.description && a.devices == b.devices &&
           a.intra_node == b.intra_node && a.inter_node == b.inter_node &&
           a.collective_costs == b.collective_costs && a.overlap == b.overlap;
  }
};

/// Checks that the cluster has one device per rank of the job; throws `config_error`
/// "FILE: field devices: ..." otherwise.
inline void check_rank_count(const cluster& c, std::size_t ranks) {
  if (c.size() == ranks)
    return;
  throw config_error(c.source + ": field devices",
                     "describes " + std::to_string(c.size()) + " device(s) but the job has " +
                         std::to_string(ranks) + " rank(s)",
                     "expected one device per rank: launch with -np " + std::to_string(c.size()) +
                         " or use a cluster file with " + std::to_string(ranks) + " devices");
}

} // namespace hspmd
