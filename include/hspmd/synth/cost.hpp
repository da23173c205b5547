#pragma once
// The cost model of the synthesizer: what one instruction costs each device, in seconds (and
// bytes of memory), as a linear function of the device's sharding ratios, so that the same
// numbers drive the search (ratios fixed) and the ratio LP (program fixed).
//
// Compute: an op run under a split rule costs device d  flops * r[s][d] / speed_d  (its share of
// the work; forward + backward FLOPs from graph/ops.hpp); under the replicated or a linear rule,
// flops / speed_d. An instruction's time is the maximum over the devices.
// Communication: one collective over all devices on the cluster's bottleneck link (between
// nodes when the job spans several), t = a * alpha + beta * x with alpha, beta from the
// cluster's collective cost model and x the algorithm's byte term (core/collective_cost.hpp):
//   all-gather / reduce-scatter, padded : alpha + beta (n - 1) B max_d r_d
//                                native : alpha + beta B (1 - min_d r_d)
//                                grouped: n alpha + beta B (1 - min_d r_d)
//   all-reduce                          : alpha + beta B           (beta includes 2 (n - 1) / n)
//   all-to-all                          : alpha + beta B (n - 1) / n max_d r_d  (x k when the
//                                         job spans nodes: a node's k devices share its link)
// with B the tensor's full size in **bytes**. Each is written per device (max over d of
// alpha + beta (n - 1) B r_d, of alpha + beta B (1 - r_d), ...) so that the LP sees a maximum of
// linear functions. Every instruction carries its backward dual too: all-gather <-> reduce-
// scatter (same algorithm), all-reduce <-> all-reduce, all-to-all <-> all-to-all, slice <->
// nothing (the gradient of a slice is a partial sum), to-partial <-> slice; loading a parameter
// replicated costs the all-reduce of its gradient, or with SFB the all-gathers of the layer's input
// and output gradient plus the full weight gradient on every device. Weight-gradient all-reduces
// are bucketed (as every data-parallel trainer does): a gradient of b bytes pays alpha * b / bucket
// of the latency (at most one alpha), so many small gradients (biases, norms) do not each pay a
// full round of latencies.
// Rates per op class: where the cluster file gives every device measured class rates
// (device_spec::rates, hspmd-profile), an op's FLOPs are divided by its class's rate on the
// device (op_class_of: GEMM, elementwise, softmax; the optimizer its own) instead of the single
// `speed`, so that a device fast at GEMMs but slow at memory-bound ops is priced as such.
// Measured compute (`compute_profile`, optional): node i costs seconds_i * rate_ref / rate_d
// in place of its FLOPs / rate_d (rate_ref: the measured device's rate of the node's class, or
// its speed without class rates), so memory-bound ops cost what they take, not their FLOPs at
// the GEMM rate.
// Optimizer: Adam's update, 12 FLOPs per parameter element, on each device's share.
// Memory per device: parameters, gradients and two Adam moments (4 copies) and every
// activation kept for the backward (all op outputs but reshapes, which are views, and every
// communicated copy), each at its placement (replicated and partial: all of it; split: the
// device's share).

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/graph/rules.hpp>
#include <hspmd/synth/ratio_lp.hpp>
#include <hspmd/synth/transfer.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::synth {

using graph::code_of;
using graph::placement_codes;
using graph::placement_of_code;

/// How split dimensions share ratio vectors.
enum class segment_policy : std::uint8_t {
  one,             ///< every split uses one ratio vector, "batch" (HAP's setting)
  batch_and_model, ///< splits reachable from the batch use "batch"; the others "model"
};

/// Which segment (ratio vector) a split of (tensor, dimension) uses, and which splits are data
/// parallel. Dimensions are joined when some rule splits them together; a class that contains
/// an input's batch dimension is the batch class.
class segment_map {
public:
  segment_map() = default;
  segment_map(const graph::graph& g, segment_policy policy) : policy_(policy) {
    offset_.resize(g.size() + 1, 0);
    for (graph::node_id i = 0; i < g.size(); ++i)
      offset_[i + 1] = offset_[i] + std::max<std::size_t>(g[i].out.rank(), 1);
    parent_.resize(offset_.back());
    std::iota(parent_.begin(), parent_.end(), 0);
    for (graph::node_id i = 0; i < g.size(); ++i) {
      const graph::node& n = g[i];
      for (const graph::rule& r : graph::rules_of(g, i)) {
        std::optional<std::size_t> first;
        const auto join = [&](graph::node_id t, placement p) {
          if (!p.is_split())
            return;
          const std::size_t k = index(t, p.dim());
          if (first)
            unite(*first, k);
          else
            first = k;
        };
        for (std::size_t k = 0; k < r.arity; ++k)
          join(n.inputs[k], r.in[k]);
        join(i, r.out);
      }
    }
    batch_class_.assign(parent_.size(), false);
    for (graph::node_id i = 0; i < g.size(); ++i)
      if (g[i].out.batch_dim)
        batch_class_[find(index(i, *g[i].out.batch_dim))] = true;
  }

  [[nodiscard]] segment_policy policy() const noexcept { return policy_; }
  [[nodiscard]] std::vector<std::string> names() const {
    return policy_ == segment_policy::one ? std::vector<std::string>{"batch"}
                                          : std::vector<std::string>{"batch", "model"};
  }
  [[nodiscard]] std::size_t count() const noexcept {
    return policy_ == segment_policy::one ? 1 : 2;
  }
  /// True when splitting `tensor` along `dim` divides the batch (data parallelism).
  [[nodiscard]] bool is_batch(graph::node_id tensor, std::size_t dim) const {
    return batch_class_.at(find(index(tensor, dim)));
  }
  /// The segment of a split of `tensor` along `dim`.
  [[nodiscard]] std::size_t of(graph::node_id tensor, std::size_t dim) const {
    return policy_ == segment_policy::one || is_batch(tensor, dim) ? 0 : 1;
  }

private:
  [[nodiscard]] std::size_t index(graph::node_id t, std::size_t dim) const {
    return offset_.at(t) + std::min(dim, offset_.at(t + 1) - offset_.at(t) - 1);
  }
  [[nodiscard]] std::size_t find(std::size_t k) const {
    while (parent_[k] != k)
      k = parent_[k];
    return k;
  }
  void unite(std::size_t a, std::size_t b) {
    a = find(a);
    b = find(b);
    if (a != b)
      parent_[std::max(a, b)] = std::min(a, b);
  }

  segment_policy policy_ = segment_policy::one;
  std::vector<std::size_t> offset_;
  std::vector<std::size_t> parent_;
  std::vector<bool> batch_class_;
};

/// Per-device costs of one instruction: one linear function of the ratios per device.
using device_costs = std::vector<linear_cost>;

/// Ratios: [segment][device], each segment summing to 1.
using ratio_table = std::vector<std::vector<double>>;

/// Evaluates device `d`'s cost at `r`.
[[nodiscard]] inline double value_at(const linear_cost& c, const ratio_table& r, std::size_t d) {
  double v = c.constant;
  for (const auto& [s, a] : c.terms)
    v += a * r.at(s).at(d);
  return v;
}

/// The largest of the devices' costs at `r` (0 for no costs), and which device it is.
[[nodiscard]] inline std::pair<double, std::size_t> max_at(const device_costs& c,
                                                           const ratio_table& r) {
  double best = 0.0;
  std::size_t at = 0;
  for (std::size_t d = 0; d < c.size(); ++d) {
    const double v = value_at(c[d], r, d);
    if (v > best) {
      best = v;
      at = d;
    }
  }
  return {best, at};
}

/// The smallest and largest share of each segment of a ratio table (what a collective's cost
/// curve piece depends on).
struct share_range {
  std::vector<double> lo, hi; ///< per segment
  share_range() = default;
  explicit share_range(const ratio_table& r) {
    for (const auto& seg : r) {
      lo.push_back(seg.empty() ? 0.0 : *std::min_element(seg.begin(), seg.end()));
      hi.push_back(seg.empty() ? 0.0 : *std::max_element(seg.begin(), seg.end()));
    }
  }
};

/// Optimizer FLOPs per parameter element (Adam: two moments, bias correction, update).
inline constexpr double optimizer_flops_per_element = 12.0;
/// Copies of a parameter a device keeps: the value, its gradient, Adam's two moments.
inline constexpr double parameter_copies = 4.0;

/// The share of an op's forward + backward work that is its forward (a product's backward runs
/// two GEMMs to the forward's one): what recomputation runs again.
inline constexpr double forward_share = 1.0 / 3.0;

/// Bytes of weight gradients all-reduced together (one latency per bucket).
inline constexpr double gradient_bucket_bytes = 4.0 * 1024.0 * 1024.0;

/// Measured compute of one graph on one device (train/profile.hpp measures it): forward +
/// backward seconds of every node at full size, and of the optimizer step (with gradient
/// clipping) per parameter element, on a device the cluster file rates at `speed` flop/s. With
/// a profile the cost model prices node i on device d at seconds[i] * speed / speed_d (its share
/// under a split rule) instead of FLOPs / speed_d: what the kernels really take, memory-bound
/// ones included, while the cluster file's speeds still say how the devices compare.
struct compute_profile {
  std::vector<double> seconds; ///< per node id of the graph it was measured on
  double optimizer_seconds_per_element = 0.0;
  double speed = 0.0; ///< flop/s of the measured device in the cluster file
  /// The measured device's GEMM rate in the precision it was measured in (its `bf16_speed` when
  /// a 16-bit run was measured): GEMM nodes' seconds convert to work at this rate, so the 16-bit
  /// speedup the measurement already holds is not applied twice. 0: `speed`.
  double gemm_speed = 0.0;
  /// The measured device's class rates in the cluster file (device_spec::rates), all 0 when it
  /// has none: a node's seconds convert to work at its class's rate. Used only when every
  /// device of the cluster has class rates too (else every class converts at `speed`).
  std::array<double, op_class_count> rates{};
  /// Per node id: the share of its seconds that is its forward (measured apart from its
  /// backward); empty: `forward_share` for every node.
  std::vector<double> forward;
  /// Per node id: the share of its seconds that does not shrink with its rows (reading a
  /// weight, a call's fixed cost), from a second measurement at half the batch (train/profile.hpp,
  /// `with_fixed_shares`). A rule that divides the node's rows but not its weights leaves that
  /// share whole on every device; one that divides a weight divides it all. Empty: 0 (every
  /// node's time proportional to its share).
  std::vector<double> fixed;
  /// Per node id: the same along a parameter's split (a convolution split by output channels
  /// still unfolds its whole input), from the model measured at a weight-splitting plan's pieces
  /// (train/profile.hpp, `with_weight_fixed_shares`); a rule that divides a parameter keeps it
  /// whole. Empty, or -1 for a node not measured so: 0 (the weight split divides it all).
  std::vector<double> weight_fixed;
};

/// The class of work of op `k` (which of a device's rates prices it).
/// (The op registry's `rate` fact, graph/ops/common.hpp: attention counts as GEMM work, two
/// products per (query, key) pair, as flash attention on a GPU.)
[[nodiscard]] constexpr op_class op_class_of(graph::op k) noexcept {
  switch (graph::rate(k)) {
  case graph::work::gemm:
    return op_class::gemm;
  case graph::work::softmax:
    return op_class::softmax;
  case graph::work::elementwise:
    break;
  }
  return op_class::elementwise;
}

/// Prices instructions for one graph on one cluster.
class cost_model {
public:
  /// `profile`: measured compute times of `g` (see `compute_profile`); FLOPs / speed without.
  /// `gemm_type`: bf16 or f16 prices GEMM-class ops (matmul, linear, batched matmul, conv2d) at
  /// each device's `bf16_speed` where it has one (mixed precision, kernels/precision.hpp).
  cost_model(const graph::graph& g, const cluster& c, segment_map segments,
             std::optional<compute_profile> profile = std::nullopt, dtype gemm_type = dtype::f32)
      : g_(&g), cluster_(&c), segments_(std::move(segments)), collectives_(c.cost_model()),
        profile_(std::move(profile)), blocks_(graph::layout_blocks(g, graph::block_ranges(g))),
        swapped_(graph::swapped_values(g)),
        sixteen_bit_(gemm_type == dtype::bf16 || gemm_type == dtype::f16) {
    data_.assign(g.size(), 0);
    for (graph::node_id i = 0; i < g.size(); ++i)
      data_[i] = g[i].kind == graph::op::input ||
                 std::ranges::any_of(g[i].inputs, [&](graph::node_id x) { return data_[x] != 0; });
    if (profile_ &&
        (profile_->seconds.size() != g.size() || !(profile_->speed > 0.0) ||
         !(profile_->optimizer_seconds_per_element >= 0.0) ||
         !std::ranges::all_of(profile_->seconds, [](double x) { return x >= 0.0; }) ||
         !std::ranges::all_of(profile_->rates, [](double x) { return x >= 0.0; }) ||
         (!profile_->forward.empty() && profile_->forward.size() != g.size()) ||
         !std::ranges::all_of(profile_->forward, [](double x) { return x >= 0.0 && x <= 1.0; }) ||
         (!profile_->fixed.empty() && profile_->fixed.size() != g.size()) ||
         !std::ranges::all_of(profile_->fixed, [](double x) { return x >= 0.0 && x <= 1.0; }) ||
         (!profile_->weight_fixed.empty() && profile_->weight_fixed.size() != g.size()) ||
         !std::ranges::all_of(profile_->weight_fixed,
                              [](double x) { return x == -1.0 || (x >= 0.0 && x <= 1.0); })))
      throw plan_error("compute profile",
                       "has " + std::to_string(profile_->seconds.size()) + " node times for " +
                           std::to_string(g.size()) +
                           " nodes, or a non-positive speed, a negative time or rate, or a "
                           "forward share outside [0, 1] or a fixed share outside [0, 1]",
                       "measure the profile on the graph being planned (train::measure_compute)");
    if (c.nodes().size() > 1)
      for (std::int64_t node : c.nodes())
        link_sharing_ = std::max<std::size_t>(
            link_sharing_, static_cast<std::size_t>(std::count_if(
                               c.devices.begin(), c.devices.end(),
                               [node](const device_spec& d) { return d.node == node; })));
    if (c.size() == 0)
      throw config_error(c.source + ": field devices", "no devices", "at least one device");
    for (const device_spec& d : c.devices) {
      if (!(d.speed > 0.0))
        throw config_error(c.source + ": device " + d.name, "speed must be positive",
                           "give the device's sustained flop/s");
      if (d.has_rates() != c.devices.front().has_rates() ||
          !std::ranges::all_of(d.rates,
                               [&](double r) { return d.has_rates() ? r > 0.0 : r == 0.0; }))
        throw config_error(c.source + ": device " + d.name + " rates",
                           "are given for some devices or classes and not for others",
                           "give all four class rates for every device (hspmd-profile measures "
                           "them) or for none");
    }
    use_rates_ =
        c.devices.front().has_rates() &&
        (!profile_ || std::ranges::all_of(profile_->rates, [](double r) { return r > 0.0; }));
    for (std::size_t k = 0; k < op_class_count; ++k)
      for (const device_spec& dv : c.devices) {
        const auto cls = static_cast<op_class>(k);
        rate_[k].push_back(cls == op_class::gemm && sixteen_bit_ && dv.bf16_speed > 0.0
                               ? dv.bf16_speed
                           : use_rates_ ? dv.rates[k]
                                        : dv.speed);
      }
  }

  [[nodiscard]] const graph::graph& graph() const noexcept { return *g_; }
  /// `hash()` (the graph's hash, synth::graph_hash) the first time, then remembered: every
  /// plan a synthesis makes on this model records it.
  template <class Hash>
  [[nodiscard]] std::uint64_t graph_hash_once(Hash&& hash) const {
    if (!graph_hash_)
      graph_hash_ = hash();
    return *graph_hash_;
  }
  [[nodiscard]] const hspmd::cluster& cluster() const noexcept { return *cluster_; }
  [[nodiscard]] const segment_map& segments() const noexcept { return segments_; }
  [[nodiscard]] std::size_t devices() const noexcept { return cluster_->size(); }

  /// The cluster's overlap fraction (cluster::overlap).
  [[nodiscard]] double overlap() const noexcept { return cluster_->overlap; }

  /// Whether `t` is a replicated parameter's gradient all-reduce (what the distributed executor
  /// runs in buckets during the backward), not SFB.
  [[nodiscard]] bool is_gradient_all_reduce(const transfer& t) const {
    return t.kind == transfer_kind::load && !t.sfb && is_parameter(t.tensor) &&
           t.to.is_replicated() && devices() > 1;
  }

  /// Bytes of the whole tensor `t`.
  [[nodiscard]] double bytes(graph::node_id t) const {
    const graph::node& n = (*g_)[t];
    return static_cast<double>(n.out.size()) * static_cast<double>(size_of(n.type));
  }
  /// Bytes of a whole working copy of `t` as the executor places it in a shared buffer (whole
  /// lines of 16 elements).
  [[nodiscard]] double working_copy_bytes(graph::node_id t) const {
    const graph::node& n = (*g_)[t];
    return static_cast<double>((n.out.size() + 15) / 16 * 16) *
           static_cast<double>(size_of(n.type));
  }
  /// Whether `t` makes an FSDP working copy: a parameter all-gathered from its shards for use.
  /// The copy lives only from its gather to its last reader, and again in the backward (the
  /// executor gathers it a second time): `transfer_memory_of` leaves it out, and a plan's memory
  /// counts the most such copies alive at once (plan.hpp, `gathered_parameter_peak`).
  [[nodiscard]] bool is_gathered_parameter(const transfer& t) const {
    return t.kind == transfer_kind::all_gather && is_parameter(t.tensor);
  }

  /// Forward + backward compute of node `id` under `r`, per device.
  [[nodiscard]] device_costs compute(graph::node_id id, const graph::rule& r) const {
    device_costs c = work(rule_flops(id, r), r.split_work ? split_segment(id, r) : std::nullopt,
                          op_class_of((*g_)[id].kind));
    if (const double f = fixed_share(id, r); f > 0.0)
      for (linear_cost& x : c) { // (one term: the split's)
        x.constant = x.terms.begin()->second * f;
        x.terms.begin()->second *= 1.0 - f;
      }
    return c;
  }
  /// The share of node `id`'s time under `r` that every device pays whole: the profile's fixed
  /// share where `r` divides the node's rows but none of its parameters, its weight-fixed share
  /// where `r` divides a parameter (0 where the profile has none).
  [[nodiscard]] double fixed_share(graph::node_id id, const graph::rule& r) const {
    if (!profile_ || !r.split_work || !split_segment(id, r))
      return 0.0;
    const graph::node& n = (*g_)[id];
    for (std::size_t k = 0; k < r.arity; ++k)
      if (r.in[k].is_split() && is_parameter(n.inputs[k]))
        return profile_->weight_fixed.empty() ? 0.0 : std::max(profile_->weight_fixed[id], 0.0);
    return profile_->fixed.empty() ? 0.0 : profile_->fixed[id];
  }
  /// Adds every device's `compute(id, r)` at `ratios` to `per_device`; returns the largest and
  /// its device (max_at of it, without building a cost per device).
  std::pair<double, std::size_t> add_compute(graph::node_id id, const graph::rule& r,
                                             const ratio_table& ratios,
                                             std::vector<double>& per_device) const {
    const double flops = rule_flops(id, r);
    const std::optional<std::size_t> seg = r.split_work ? split_segment(id, r) : std::nullopt;
    const std::vector<double>& rate = rate_[static_cast<std::size_t>(op_class_of((*g_)[id].kind))];
    const std::vector<double>* share = seg ? &ratios.at(*seg) : nullptr;
    const double f = fixed_share(id, r);
    double best = 0.0;
    std::size_t at = 0;
    for (std::size_t d = 0; d < rate.size(); ++d) {
      const double v =
          share != nullptr ? flops / rate[d] * (f + (1.0 - f) * (*share)[d]) : flops / rate[d];
      per_device[d] += v;
      if (v > best) {
        best = v;
        at = d;
      }
    }
    return {best, at};
  }
  /// The largest device's `compute(id, r)` at `ratios` (max_at of it, without building a cost
  /// per device).
  [[nodiscard]] double compute_max(graph::node_id id, const graph::rule& r,
                                   const ratio_table& ratios) const {
    const double flops = rule_flops(id, r);
    const std::optional<std::size_t> seg = r.split_work ? split_segment(id, r) : std::nullopt;
    const std::vector<double>& rate = rate_[static_cast<std::size_t>(op_class_of((*g_)[id].kind))];
    double best = 0.0;
    if (seg) {
      const std::vector<double>& share = ratios.at(*seg);
      const double f = fixed_share(id, r);
      for (std::size_t d = 0; d < rate.size(); ++d)
        best = std::max(best, flops / rate[d] * (f + (1.0 - f) * share[d]));
    } else {
      for (std::size_t d = 0; d < rate.size(); ++d)
        best = std::max(best, flops / rate[d]);
    }
    return best;
  }

  /// Ops whose work is a GEMM (a 16-bit run's tensor-core rate applies).
  [[nodiscard]] static constexpr bool is_gemm(graph::op k) noexcept {
    return op_class_of(k) == op_class::gemm;
  }

  /// Communication of the rule itself (a vocabulary-parallel cross-entropy all-reduces the
  /// per-row maxima and sums), per device; empty when there is none.
  [[nodiscard]] device_costs rule_comm(graph::node_id id, const graph::rule& r,
                                       const ratio_table& ratios) const {
    if (!r.vocab_parallel)
      return {};
    const graph::node& logits = (*g_)[(*g_)[id].inputs[0]];
    const double row_bytes =
        static_cast<double>(logits.out.dims[0]) * static_cast<double>(size_of(logits.type));
    (void)ratios;
    const alpha_beta p = params(collective::all_reduce, uneven_algorithm::native, row_bytes);
    return uniform(2.0 * (p.alpha + p.beta * row_bytes));
  }

  /// Seconds of communication of `t` (forward and backward), per device, at `ratios` (which
  /// pick the piece of each cost curve). Every device's is the same function of its own share
  /// (`comm_of`); empty when there is none.
  [[nodiscard]] device_costs comm(const transfer& t, const ratio_table& ratios) const {
    const std::optional<linear_cost> c = comm_of(t, ratios);
    return c ? device_costs(devices(), *c) : device_costs{};
  }
  /// The largest device's communication seconds of `t` at `ratios` (max_at of `comm`, without
  /// building a cost per device); `range`: the ratios' share_range, where the caller keeps it.
  [[nodiscard]] double comm_max(const transfer& t, const ratio_table& ratios) const {
    return comm_max(t, ratios, share_range(ratios));
  }
  [[nodiscard]] double comm_max(const transfer& t, const ratio_table& ratios,
                                const share_range& range) const {
    const std::optional<linear_cost> c = comm_of(t, range);
    if (!c)
      return 0.0;
    double v = c->constant;
    for (const auto& [seg, a] : c->terms)
      v += a * (a >= 0.0 ? range.hi.at(seg) : range.lo.at(seg));
    if (c->terms.size() > 1) // shares of several segments: device by device
      return max_at(device_costs(devices(), *c), ratios).first;
    return std::max(v, 0.0);
  }
  /// The communication of `t` as a function of a device's shares, the same on every device
  /// (see the file comment), or nothing when it has none.
  [[nodiscard]] std::optional<linear_cost> comm_of(const transfer& t,
                                                   const ratio_table& ratios) const {
    return comm_of(t, share_range(ratios));
  }
  [[nodiscard]] std::optional<linear_cost> comm_of(const transfer& t,
                                                   const share_range& range) const;
  /// The communication of a transfer of kind K (comm_of dispatches on the kind): one
  /// specialization per kind after the class, a new kind's price.
  template <transfer_kind K>
  [[nodiscard]] std::optional<linear_cost> comm_of_kind(const transfer& t,
                                                        const share_range& range) const;

  /// An all-gather's or reduce-scatter's communication (forward, dual, and for an FSDP-gathered
  /// parameter the second gather of the backward) under its uneven algorithm; `split`: the
  /// placement of the split side.
  [[nodiscard]] linear_cost uneven_gather_or_scatter(const transfer& t, placement split,
                                                     const share_range& range) const {
    const double b = bytes(t.tensor);
    const double nd = static_cast<double>(devices());
    const std::size_t seg = segments_.of(t.tensor, split.dim());
    const collective fwd = *facts(t.kind).forward;
    const collective bwd = *facts(t.kind).backward;
    linear_cost c;
    // An FSDP-gathered parameter is gathered again for the backward (its copy is not kept).
    const std::array<collective, 3> ops = {fwd, bwd, fwd};
    const std::size_t count = is_gathered_parameter(t) ? 3 : 2;
    for (std::size_t o = 0; o < count; ++o) {
      const collective op = ops[o];
      const uneven_algorithm a = t.algorithm;
      if (a == uneven_algorithm::padded) {
        const double x = (nd - 1.0) * b * range.hi.at(seg);
        const alpha_beta p = params(op, a, x);
        add(c, p.alpha, seg, p.beta * (nd - 1.0) * b);
      } else {
        const double x = b * (1.0 - range.lo.at(seg));
        const alpha_beta p = params(op, a, x);
        const double latency = a == uneven_algorithm::grouped ? nd : 1.0;
        add(c, latency * p.alpha + p.beta * b, seg, -p.beta * b);
      }
    }
    return c;
  }

  /// Compute a transfer adds: the optimizer's update of a loaded parameter, and with SFB the
  /// full weight gradient on every device (in place of its share).
  [[nodiscard]] device_costs transfer_compute(const transfer& t) const {
    if (t.kind != transfer_kind::load || !is_parameter(t.tensor))
      return {};
    const double elems = static_cast<double>((*g_)[t.tensor].out.size());
    device_costs c =
        work(optimizer_flops(t.tensor),
             t.to.is_split() ? std::optional<std::size_t>(segments_.of(t.tensor, t.to.dim()))
                             : std::nullopt,
             op_class::optimizer);
    if (t.sfb) {
      const auto [x, dy, seg] = sfb_factors(t.tensor);
      (void)x;
      (void)dy;
      // dW = X^T dY over all rows, at the rate the profile measured for its consumer
      const graph::node_id use = sfb_consumer(t.tensor).value();
      const graph::node_cost nc = graph::cost_of(*g_, use);
      const double rate = profile_ && nc.forward_flops + nc.backward_flops > 0.0
                              ? node_flops(use) / (nc.forward_flops + nc.backward_flops)
                              : 1.0;
      const double full = 2.0 * elems * sfb_rows(t.tensor) * rate;
      for (std::size_t d = 0; d < devices(); ++d) {
        const double inv = 1.0 / device_rate(d, op_class::gemm);
        add(c[d], full * inv, seg, -full * inv);
      }
    }
    return c;
  }

  /// A pipeline stage's received values (the inputs an earlier stage sends it, the gradients a
  /// later one sends back): loading one at a placement costs its box over `link`, which
  /// `sharing` devices share (latency + the box's bytes x sharing / bandwidth), what the
  /// boundary send takes -- so the search loads them split rather than whole where that is
  /// cheaper. Other inputs load free.
  void set_received(const std::vector<graph::node_id>& inputs, const link_spec& link,
                    double sharing) {
    received_.assign(g_->size(), 0);
    for (graph::node_id t : inputs)
      received_.at(t) = 1;
    received_link_ = link;
    received_sharing_ = sharing;
  }
  [[nodiscard]] bool is_received(graph::node_id t) const {
    return !received_.empty() && received_[t] != 0;
  }

  /// Copies of every kept value that depends on the data (a pipeline stage keeps one set of
  /// activations per micro-batch it holds at once, program/pipeline_plan.hpp); 1 by default.
  /// Values a recomputed block holds only while it runs are not multiplied (one block runs at
  /// a time). The search, the ratio LP's memory rows and a plan's memory all count them so.
  void set_activation_copies(double k) { activation_copies_ = k; }
  [[nodiscard]] double activation_copies() const noexcept { return activation_copies_; }
  /// The copies of `t` kept all step (see set_activation_copies).
  [[nodiscard]] double kept_copies(graph::node_id t) const {
    return activation_copies_ != 1.0 && depends_on_data(t) ? activation_copies_ : 1.0;
  }
  /// Whether `t` is an input or computed from one (a value a micro-batch brings), not from
  /// parameters alone.
  [[nodiscard]] bool depends_on_data(graph::node_id t) const { return data_.at(t) != 0; }

  /// Bytes a device keeps for tensor `t` at placement `p` (parameters: 4 copies), as a function
  /// of its share: the same on every device.
  [[nodiscard]] linear_cost memory_of(graph::node_id t, placement p) const {
    const double b = bytes(t) * (is_parameter(t) ? parameter_copies : 1.0);
    return p.is_split() ? linear_cost{0.0, {{segments_.of(t, p.dim()), b}}} : linear_cost{b, {}};
  }

  /// Bytes a device keeps for what transfer `t` makes: a loaded parameter keeps its value,
  /// gradient and optimizer state (4 copies); a parameter converted to another placement (a
  /// tied weight's second use) is a working copy like an activation, except an FSDP gather,
  /// whose copy is transient (none here; `gathered_parameter_peak` in plan.hpp).
  [[nodiscard]] linear_cost transfer_memory_of(const transfer& t) const {
    if (t.kind == transfer_kind::load || !is_parameter(t.tensor))
      return memory_of(t.tensor, t.to);
    if (is_gathered_parameter(t)) // transient (see is_gathered_parameter)
      return {};
    linear_cost c = memory_of(t.tensor, t.to);
    c.constant /= parameter_copies;
    for (auto& term : c.terms)
      term.second /= parameter_copies;
    return c;
  }

  /// Whether node `id`'s value is a view of its input's elements where they lie, as the
  /// executor places it (graph::is_view: a reshape, a permute read by strides next to a batched
  /// matmul): it holds no memory of its own.
  [[nodiscard]] bool is_view(graph::node_id id) const { return graph::is_view(*g_, id, swapped_); }
  /// Bytes device d keeps for the output of op `t` at placement `p`: a view's is its input's
  /// (nothing new); every other output is kept for the backward.
  [[nodiscard]] linear_cost output_memory_of(graph::node_id t, placement p) const {
    return is_view(t) ? linear_cost{} : memory_of(t, p);
  }

  /// Activation recomputation (exec::executor::recompute over the model's blocks,
  /// graph/blocks.hpp): the values it does not keep are computed again when the backward reaches
  /// their block. Memory: such a value is held only while its block runs (a plan keeps the
  /// largest block's at once, not every block's); time: its op's forward runs twice, and a
  /// collective that made a working copy for it runs its forward again (an FSDP copy it reads is
  /// gathered once more). `none` below: kept.
  static constexpr std::size_t none = graph::block_layout::none;
  [[nodiscard]] const graph::block_layout& blocks() const noexcept { return blocks_; }
  /// Whether the model has blocks to recompute.
  [[nodiscard]] bool has_blocks() const noexcept { return !blocks_.ranges.empty(); }
  /// The block whose replay computes op `id`'s output again, or `none` (kept).
  [[nodiscard]] std::size_t recomputed_block(graph::node_id id) const {
    return blocks_.recomputed[id] ? blocks_.block_of[id] : none;
  }
  /// The block whose replay makes transfer `t`'s copy again (fused before op `at`), or `none`:
  /// a copy of a value that only nodes of `at`'s block read (loads and FSDP copies: none, those
  /// are kept or counted apart; graph::block_ranges puts a copy for a block's first op in it).
  [[nodiscard]] std::size_t recomputed_copy_block(const transfer& t, graph::node_id at) const {
    if (t.kind == transfer_kind::load || t.kind == transfer_kind::to_partial ||
        is_gathered_parameter(t))
      return none;
    const std::size_t b = blocks_.readers_in[t.tensor];
    return b != none && b == blocks_.block_of[at] ? b : none;
  }
  /// Compute the replay adds to op `id` under `r` (empty when its output is kept).
  [[nodiscard]] device_costs replay_compute(graph::node_id id, const graph::rule& r) const {
    if (recomputed_block(id) == none)
      return {};
    return scaled(compute(id, r), forward_fraction(id));
  }
  /// The share of transfer `t`'s communication (fused before op `at`) that the replay runs
  /// again: its forward collective (1/2 of the forward-backward pair) where its copy is
  /// recomputed, an FSDP copy that a recomputed op reads gathered once more (1/3 of its three
  /// gathers), else 0.
  [[nodiscard]] double replay_share(const transfer& t, graph::node_id at) const {
    if (is_gathered_parameter(t))
      return recomputed_block(at) != none ? 1.0 / 3.0 : 0.0;
    return recomputed_copy_block(t, at) != none ? 0.5 : 0.0;
  }
  /// Communication the replay adds to transfer `t` fused before op `at` (see `replay_share`).
  [[nodiscard]] device_costs replay_comm(const transfer& t, graph::node_id at,
                                         const ratio_table& ratios) const {
    const double f = replay_share(t, at);
    return f > 0.0 ? scaled(comm(t, ratios), f) : device_costs{};
  }
  [[nodiscard]] static device_costs scaled(device_costs c, double f) {
    for (auto& x : c) {
      x.constant *= f;
      for (auto& term : x.terms)
        term.second *= f;
    }
    return c;
  }

  /// Can parameter `w` have its gradient by SFB? (One consumer, a matmul or linear whose input
  /// rows are split.) `rows_split` says whether the consumer's rule splits the rows.
  [[nodiscard]] bool sfb_possible(graph::node_id w) const { return sfb_consumer(w).has_value(); }

  [[nodiscard]] bool is_parameter(graph::node_id t) const {
    return (*g_)[t].kind == graph::op::parameter;
  }

  /// Forward + backward work of node `id` in FLOPs: counted from the op, or with a profile the
  /// measured seconds times the measured device's speed.
  [[nodiscard]] double node_flops(graph::node_id id) const {
    if (profile_)
      return profile_->seconds.at(id) * profile_rate(op_class_of((*g_)[id].kind));
    const graph::node_cost nc = graph::cost_of(*g_, id);
    return nc.forward_flops + nc.backward_flops;
  }
  [[nodiscard]] const std::optional<compute_profile>& profile() const noexcept { return profile_; }

  /// Whether ops are priced at the devices' per-class rates (every device has them, and a
  /// profile, if any, holds its measured device's).
  [[nodiscard]] bool class_rates() const noexcept { return use_rates_; }

  /// Device d's rate (flop/s) for work of class `c` in this model's precision.
  [[nodiscard]] double device_rate(std::size_t d, op_class c) const {
    return rate_[static_cast<std::size_t>(c)].at(d);
  }

  /// The per-device linear cost of `flops` of work of class `cls`, split by segment `seg` or
  /// not at all.
  [[nodiscard]] device_costs work(double flops, std::optional<std::size_t> seg,
                                  op_class cls) const {
    device_costs c(devices());
    for (std::size_t d = 0; d < devices(); ++d) {
      const double t = flops / device_rate(d, cls);
      c[d] = seg ? linear_cost{0.0, {{*seg, t}}} : linear_cost{t, {}};
    }
    return c;
  }

  /// The segment a split rule divides the work of node `id` by.
  [[nodiscard]] std::optional<std::size_t> split_segment(graph::node_id id,
                                                         const graph::rule& r) const {
    if (r.out.is_split())
      return segments_.of(id, r.out.dim());
    const graph::node& n = (*g_)[id];
    for (std::size_t k = 0; k < r.arity; ++k)
      if (r.in[k].is_split())
        return segments_.of(n.inputs[k], r.in[k].dim());
    return std::nullopt;
  }

  /// The share of node `id`'s forward + backward work that is its forward: measured where the
  /// profile has it, else `forward_share`.
  [[nodiscard]] double forward_fraction(graph::node_id id) const {
    return profile_ && !profile_->forward.empty() ? profile_->forward[id] : forward_share;
  }

  /// Forward + backward work of node `id` under rule `r` (a vocabulary-parallel cross-entropy
  /// adds the combination of its per-row maxima and sums), before the split.
  [[nodiscard]] double rule_flops(graph::node_id id, const graph::rule& r) const {
    double flops = node_flops(id);
    if (r.vocab_parallel) // each rank's share, plus the combination of per-row maxima and sums
      flops += 4.0 * static_cast<double>((*g_)[(*g_)[id].inputs[0]].out.dims[0]);
    return flops;
  }

  /// The optimizer's work (at the devices' optimizer rates) to update all of parameter `w`.
  [[nodiscard]] double optimizer_flops(graph::node_id w) const {
    return (profile_ ? profile_->optimizer_seconds_per_element * profile_rate(op_class::optimizer)
                     : optimizer_flops_per_element) *
           static_cast<double>((*g_)[w].out.size());
  }

private:
  // The rate the profile's seconds of class `c` convert to work at (the measured device's).
  [[nodiscard]] double profile_rate(op_class c) const {
    if (c == op_class::gemm && sixteen_bit_ && profile_->gemm_speed > 0.0)
      return profile_->gemm_speed;
    return use_rates_ ? profile_->rates[static_cast<std::size_t>(c)] : profile_->speed;
  }

  // The cost piece that applies at byte term x. A measured curve's later pieces may start
  // below zero (a steeper line); the linear functions handed to the ratio LP must stay
  // non-negative at every ratio, so the latency is taken as at least 0 (an error of |alpha|).
  [[nodiscard]] alpha_beta params(collective op, uneven_algorithm a, double x) const {
    alpha_beta p = collectives_.params(op, has_algorithms(op) ? a : uneven_algorithm::native, x);
    p.alpha = std::max(p.alpha, 0.0);
    return p;
  }
  [[nodiscard]] device_costs uniform(double seconds) const {
    return device_costs(devices(), linear_cost{seconds, {}});
  }
  static void add(linear_cost& c, double constant, std::size_t seg, double coef) {
    c.constant += constant;
    for (auto& [s, a] : c.terms)
      if (s == seg) {
        a += coef;
        return;
      }
    c.terms.emplace_back(seg, coef);
  }

  // The single consumer of parameter w when it is the weight (operand 1) of a matmul/linear.
  [[nodiscard]] std::optional<graph::node_id> sfb_consumer(graph::node_id w) const {
    std::optional<graph::node_id> use;
    for (graph::node_id i = w + 1; i < g_->size(); ++i)
      for (std::size_t k = 0; k < (*g_)[i].inputs.size(); ++k)
        if ((*g_)[i].inputs[k] == w) {
          if (use || k != 1 ||
              ((*g_)[i].kind != graph::op::matmul && (*g_)[i].kind != graph::op::linear))
            return std::nullopt;
          use = i;
        }
    return use;
  }
  [[nodiscard]] double sfb_rows(graph::node_id w) const {
    const graph::node& y = (*g_)[sfb_consumer(w).value()];
    return static_cast<double>(y.out.size()) / static_cast<double>(y.out.dims.back());
  }
  // Bytes of the input rows and output-gradient rows, and the rows' segment.
  struct sfb_sizes {
    double x;
    double dy;
    std::size_t seg;
  };
  [[nodiscard]] sfb_sizes sfb_factors(graph::node_id w) const {
    const graph::node_id use = sfb_consumer(w).value();
    const graph::node& y = (*g_)[use];
    const graph::node_id xin = y.inputs[0];
    return {bytes(xin), bytes(use), segments_.of(use, 0)};
  }

  const graph::graph* g_;
  mutable std::optional<std::uint64_t> graph_hash_; // (graph_hash_once)
  const hspmd::cluster* cluster_;
  segment_map segments_;
  collective_cost_model collectives_;
  std::optional<compute_profile> profile_;
  graph::block_layout blocks_;                           // the model's blocks, for recomputation
  std::vector<bool> swapped_;                            // graph::swapped_values: strided views
  std::array<std::vector<double>, op_class_count> rate_; // [class][device] flop/s
  bool sixteen_bit_ = false;                             // GEMMs at the devices' bf16 rates
  double activation_copies_ = 1.0;
  std::vector<char> received_; // per node: a pipeline stage's received value (set_received)
  link_spec received_link_;
  double received_sharing_ = 1.0;
  std::vector<char> data_;       // per node: depends_on_data
  bool use_rates_ = false;       // ops at the devices' class rates
  std::size_t link_sharing_ = 1; ///< devices behind one inter-node link (all-to-all)
};

// ---- each transfer kind's price (cost_model::comm_of_kind) -------------------------------------

template <transfer_kind K>
std::optional<linear_cost> cost_model::comm_of_kind(const transfer& /*t*/,
                                                    const share_range& /*range*/) const {
  static_assert(static_cast<std::size_t>(K) >= transfer_kind_count,
                "every transfer kind prices itself: specialize cost_model::comm_of_kind");
  return std::nullopt;
}

// Local: no communication.
template <>
inline std::optional<linear_cost>
cost_model::comm_of_kind<transfer_kind::slice>(const transfer& /*t*/,
                                               const share_range& /*range*/) const {
  return std::nullopt;
}
template <>
inline std::optional<linear_cost>
cost_model::comm_of_kind<transfer_kind::to_partial>(const transfer& /*t*/,
                                                    const share_range& /*range*/) const {
  return std::nullopt;
}

// A replicated parameter's gradient: all-reduced in buckets, or by SFB all-gathering the layer's
// input rows and output-gradient rows (native algorithm).
template <>
inline std::optional<linear_cost>
cost_model::comm_of_kind<transfer_kind::load>(const transfer& t, const share_range& range) const {
  if (is_received(t.tensor)) { // (set_received)
    const double per_byte = received_sharing_ / received_link_.bandwidth;
    const double b = bytes(t.tensor) * per_byte;
    if (t.to.is_split())
      return linear_cost{received_link_.latency, {{segments_.of(t.tensor, t.to.dim()), b}}};
    return linear_cost{received_link_.latency + b, {}};
  }
  if (!is_parameter(t.tensor) || !t.to.is_replicated() || devices() == 1)
    return std::nullopt;
  const double b = bytes(t.tensor);
  if (!t.sfb) {
    const alpha_beta p = params(collective::all_reduce, uneven_algorithm::native, b);
    return linear_cost{p.alpha * std::min(1.0, b / gradient_bucket_bytes) + p.beta * b, {}};
  }
  const auto [x, dy, seg] = sfb_factors(t.tensor);
  const double fb = x + dy;
  const double share = 1.0 - range.lo.at(seg);
  const alpha_beta p = params(collective::all_gather_v, uneven_algorithm::native, fb * share);
  return linear_cost{p.alpha + p.beta * fb, {{seg, -p.beta * fb}}};
}

// Forward and its dual (an all-reduce too).
template <>
inline std::optional<linear_cost>
cost_model::comm_of_kind<transfer_kind::all_reduce>(const transfer& t,
                                                    const share_range& /*range*/) const {
  const double b = bytes(t.tensor);
  const alpha_beta p = params(collective::all_reduce, uneven_algorithm::native, b);
  return linear_cost{2.0 * (p.alpha + p.beta * b), {}};
}

template <>
inline std::optional<linear_cost>
cost_model::comm_of_kind<transfer_kind::all_gather>(const transfer& t,
                                                    const share_range& range) const {
  return uneven_gather_or_scatter(t, t.from, range);
}
template <>
inline std::optional<linear_cost>
cost_model::comm_of_kind<transfer_kind::reduce_scatter>(const transfer& t,
                                                        const share_range& range) const {
  return uneven_gather_or_scatter(t, t.to, range);
}

// Forward and back, each device sending its share of the source split to every other.
template <>
inline std::optional<linear_cost>
cost_model::comm_of_kind<transfer_kind::all_to_all>(const transfer& t,
                                                    const share_range& range) const {
  const double b = bytes(t.tensor);
  const double nd = static_cast<double>(devices());
  const std::size_t seg = segments_.of(t.tensor, t.from.dim());
  const double per = b * (nd - 1.0) / nd * static_cast<double>(link_sharing_);
  const alpha_beta& p =
      params(collective::all_to_all_v, uneven_algorithm::native, per * range.hi.at(seg));
  return linear_cost{2.0 * p.alpha, {{seg, 2.0 * p.beta * per}}};
}

inline std::optional<linear_cost> cost_model::comm_of(const transfer& t,
                                                      const share_range& range) const {
  using price_fn =
      std::optional<linear_cost> (cost_model::*)(const transfer&, const share_range&) const;
  static constexpr auto table = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<price_fn, transfer_kind_count>{
        &cost_model::comm_of_kind<static_cast<transfer_kind>(I)>...};
  }
  (std::make_index_sequence<transfer_kind_count>{});
  return (this->*table[static_cast<std::size_t>(t.kind)])(t, range);
}

} // namespace hspmd::synth
