#pragma once
// A discrete-event simulation of one training step of a plan on a cluster: what the distributed
// executor (exec/distributed.hpp) does, device by device, in its order. That order is the plan's
// step program (program/step.hpp), the very list the executor runs: lowered for device 0 (a
// one-level plan gives every device the same list) and priced instruction by instruction.
//
// The cost model (synth/plan.hpp, `evaluate`) adds up, step by step, the slowest device's
// compute and the step's collectives, less a credit for the gradient all-reduce. A run is not
// that sum: devices only wait for each other at collectives, so between two collectives each
// runs its own compute at its own pace (a data-parallel plan's forward is one stretch, whose time
// is the slowest device's total, not the sum of per-op maxima); gradient buckets travel while
// the backward goes on and slow it down where they share its processor; two collectives in
// flight on the same links share their bandwidth; and a rank computes on the whole rows that
// lowering cut (10 of 16 sequences, not 0.6 of them). The simulation follows that:
//
// - Per device a clock of its compute stream. The forward walks the plan's steps in order: a
//   step's collectives (their forward halves) start when the last device reaches them and end
//   together; its op runs the forward part of its forward + backward work (measured where the
//   cost model has a profile, a third otherwise: cost_model::forward_fraction) on each device at
//   that device's rate and whole-shard share. The loss all-reduce ends the forward.
// - The backward walks the steps in reverse: recomputed ops replay their forward first (with the
//   forward collectives of recomputed copies), then the op's backward (the rest), then its
//   collectives' backward halves (an FSDP parameter: gathered again and its gradient
//   reduce-scattered). A replicated parameter's gradient joins the open bucket at its first
//   reader's backward; a full bucket (4 MiB, or the executor's size) is posted, and starts when
//   the last device has posted it and the buckets before it are done (one stream of
//   non-blocking all-reduces, as the executor runs them).
// - While a bucket travels, compute on a device progresses at the cluster's `overlap` rate (the
//   calibrated fraction of an all-reduce that hides behind compute: 0 serializes them, 1 hides
//   the all-reduce fully); on a device the cluster file emulates s times slower, the (s - 1) / s
//   of each op that the executor spends busy-waiting (and driving the collectives in flight)
//   hides it too. A blocking collective in flight with a bucket shares the links with it (each
//   at half bandwidth until one ends).
// - After the backward: SFB's broadcasts of factors and their full weight-gradient products,
//   the wait for the last bucket, the gradient-norm all-reduce, and the optimizer over each
//   device's parameters (its shard of a sharded one).
//
// Collective times come from the cost model's curves (the cluster's, calibrated where it was),
// compute from its rates (or a measured profile): the simulation adds the executor's structure,
// not new constants. A one-level plan's collectives span all devices; hierarchical plans
// (synth/hierarchical.hpp) are not simulated here.

#include <hspmd/program/lower.hpp>
#include <hspmd/program/step.hpp>
#include <hspmd/sim/trace.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/shards.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::sim {

/// Measured compute of one plan at every device's own pieces (train/profile.hpp,
/// `measure_shards`): each device's program run on the measuring device, node by node. Where a
/// simulation has it, a device's op costs what its piece took, scaled from the measuring
/// device's rate to its own, instead of the profile's full-size time times its share: what an
/// op keeps whole when its rows or its weight are divided (a weight read, a convolution's
/// unfolding of its whole input, a call's fixed cost) is in the measurement.
struct shard_times {
  std::size_t device = 0; ///< the measuring device (its rates convert the seconds)
  /// [device][node id of the graph]: forward + backward seconds of the node's op on that
  /// device's piece; negative: not measured (priced from the profile)
  std::vector<std::vector<double>> seconds;
  std::vector<double> optimizer; ///< [device]: seconds of its optimizer step (clipping included)
};

/// What to simulate and what to record.
struct options {
  /// Shares at the whole lengths lowering cuts (the executor's); false: the plan's ratios.
  bool whole_shards = true;
  /// Bytes of gradients per all-reduce bucket (the executor's `--bucket-mb`).
  double bucket_bytes = synth::gradient_bucket_bytes;
  /// Devices whose timelines are recorded (for a trace): none by default.
  std::vector<std::size_t> traced;
  /// The plan's compute measured at each device's pieces (for this plan and cluster), if any.
  const shard_times* measured = nullptr;
  /// Bytes of one gradient element (the executor's element type).
  std::size_t element_bytes = 4;
  /// Activation recomputation over the model's blocks; unset: the plan's choice.
  std::optional<bool> recompute;
  /// Record the name of every instruction priced, in order (`result::program`).
  bool names = false;
};

/// One simulated step.
struct result {
  double step_time = 0.0;            ///< seconds until the last device finishes the optimizer
  std::size_t slowest = 0;           ///< the device that finishes last
  std::vector<double> compute;       ///< per device: seconds computing (held time included)
  std::vector<double> held;          ///< per device: of which held back by buckets in flight
  std::vector<double> communication; ///< per device: seconds in blocking collectives
  std::vector<double> waiting;       ///< per device: seconds waiting for other devices
  std::vector<double> end;           ///< per device: when it is done (the sum of the three)
  double forward = 0.0;              ///< when the last device ends the forward (loss included)
  double backward = 0.0;             ///< when the last device ends the backward's compute
  double gradient_exposed = 0.0;     ///< seconds the last bucket ends after the backward
  double gradient_seconds = 0.0;     ///< all-reduce seconds of all buckets, uncontended
  std::size_t buckets = 0;
  bool whole_shards = false; ///< shares were taken at whole lengths
  /// The timelines of `options::traced`, in that order (trace-event spans, microseconds).
  std::vector<trace_recorder> timelines;
  /// With `options::names`: the step program priced, one name per instruction in order
  /// (program::name; the executor's trace names what it ran the same way).
  std::vector<std::string> program;
};

namespace detail {

// The stream of gradient buckets: each all-reduce starts when every device has posted it and
// the one before has ended.
struct bucket_stream {
  struct bucket {
    double ready = 0.0;
    double seconds = 0.0; // uncontended
    double start = 0.0;
    double end = 0.0;
  };
  std::vector<bucket> q;

  void post(double ready, double seconds) {
    const double start = std::max(ready, q.empty() ? 0.0 : q.back().end);
    q.push_back({ready, seconds, start, start + seconds});
  }
  [[nodiscard]] double done() const { return q.empty() ? 0.0 : q.back().end; }

  // A blocking collective of `seconds` starting at `s` (no device past `s`, so the buckets after
  // it may still move): where a bucket is in flight the two share the links, each at half rate,
  // until one of them ends; later buckets start later accordingly. Returns its end.
  double contend(double s, double seconds) {
    double t = s;
    double left = seconds;
    for (std::size_t k = 0; k < q.size() && left > 0.0; ++k) {
      bucket& b = q[k];
      if (b.end <= t)
        continue;
      if (b.start >= t + left)
        break;
      left -= std::max(0.0, b.start - t); // alone until the bucket starts
      t = std::max(t, b.start);
      const double rest = b.end - t; // the bucket's remaining seconds alone
      const double shared = std::min(left, rest);
      b.end += shared; // both at half rate for 2 x shared
      t += 2.0 * shared;
      left -= shared;
      for (std::size_t j = k + 1; j < q.size(); ++j) { // later buckets wait for it
        q[j].start = std::max(q[j].ready, q[j - 1].end);
        q[j].end = q[j].start + q[j].seconds;
      }
    }
    return t + left;
  }
};

} // namespace detail

/// Simulates one training step of plan `p` (one level) priced by `m`.
[[nodiscard]] inline result simulate(const synth::plan& p, const synth::cost_model& m,
                                     const options& o = {}) {
  using synth::transfer;
  using synth::transfer_kind;
  const graph::graph& g = m.graph();
  const std::size_t n = m.devices();
  const synth::ratio_table& ratios = p.ratios;
  const synth::share_range range(ratios);
  // The rate a device's compute keeps while a bucket travels: the cluster's overlap, and on a
  // device emulated s times slower (exec/distributed.hpp stretches each op by busy-waiting that
  // drives the collectives in flight) the (s - 1) / s of each op spent polling as well.
  const double cluster_overlap = std::clamp(m.overlap(), 0.0, 1.0);
  std::vector<double> overlap(n);
  for (std::size_t d = 0; d < n; ++d) {
    const double s = std::max(1.0, m.cluster().devices[d].slowdown);
    overlap[d] = cluster_overlap + (1.0 - cluster_overlap) * (s - 1.0) / s;
  }

  result r;
  r.compute.assign(n, 0.0);
  r.held.assign(n, 0.0);
  r.communication.assign(n, 0.0);
  r.waiting.assign(n, 0.0);
  r.timelines.resize(o.traced.size());
  for (std::size_t k = 0; k < o.traced.size(); ++k)
    if (o.traced[k] >= n)
      throw plan_error("simulate",
                       "traced device " + std::to_string(o.traced[k]) + " of " + std::to_string(n),
                       "trace devices 0 to " + std::to_string(n - 1));

  // Shares at whole lengths, per (segment, unit count): the executor's integer rows.
  std::optional<synth::shard_classes> classes;
  if (o.whole_shards && n > 1) {
    try {
      classes.emplace(g, p);
    } catch (const plan_error&) { // routing that cannot be cut: the ratios stand
    }
  }
  r.whole_shards = classes.has_value();
  std::map<std::pair<std::size_t, std::size_t>, std::vector<double>> whole;
  const auto shares = [&](std::size_t seg, graph::node_id t,
                          std::size_t dim) -> const std::vector<double>& {
    if (!classes)
      return ratios.at(seg);
    const std::size_t units = classes->units(t, dim);
    auto [it, fresh] = whole.try_emplace({seg, units});
    if (fresh) {
      const std::vector<std::size_t> l = shard_lengths(units, ratios.at(seg));
      it->second.resize(n);
      for (std::size_t d = 0; d < n; ++d)
        it->second[d] = static_cast<double>(l[d]) / static_cast<double>(units);
    }
    return it->second;
  };
  // The share of node `id`'s work each device does under rule `rule` (nullptr: all of it).
  const auto work_shares = [&](graph::node_id id,
                               const graph::rule& rule) -> const std::vector<double>* {
    const std::optional<std::size_t> seg =
        rule.split_work ? m.split_segment(id, rule) : std::nullopt;
    if (!seg)
      return nullptr;
    if (rule.out.is_split())
      return &shares(*seg, id, rule.out.dim());
    for (std::size_t k = 0; k < rule.arity; ++k)
      if (rule.in[k].is_split())
        return &shares(*seg, g[id].inputs[k], rule.in[k].dim());
    return &ratios.at(*seg);
  };

  std::vector<double> clock(n, 0.0);
  std::vector<std::size_t> cursor(n, 0); // per device: the first bucket that may still overlap
  detail::bucket_stream stream;

  const auto record = [&](std::size_t d, const std::string& name, trace_kind kind, double from,
                          double to, nlohmann::json args) {
    for (std::size_t k = 0; k < o.traced.size(); ++k)
      if (o.traced[k] == d)
        r.timelines[k].add_at(name, kind, from * 1e6, (to - from) * 1e6, std::move(args));
  };
  // Device d computes `seconds` from its clock on: at full rate, and at `overlap` of it while
  // a bucket travels.
  const auto advance = [&](std::size_t d, double seconds) {
    double t = clock[d];
    double left = seconds;
    double held = 0.0;
    std::size_t& k = cursor[d];
    while (left > 0.0) {
      while (k < stream.q.size() && stream.q[k].end <= t)
        ++k;
      if (k == stream.q.size() || stream.q[k].start >= t + left) {
        t += left;
        break;
      }
      const auto& b = stream.q[k];
      left -= std::max(0.0, b.start - t);
      t = std::max(t, b.start);
      const double o_d = overlap[d];
      if (o_d > 0.0 && o_d * (b.end - t) >= left) {
        held += left / o_d - left;
        t += left / o_d;
        break;
      }
      held += (1.0 - o_d) * (b.end - t);
      left -= o_d * (b.end - t);
      t = b.end;
    }
    r.compute[d] += t - clock[d];
    r.held[d] += held;
    clock[d] = t;
  };
  std::vector<double> per_device(n, 0.0);
  // Every device computes per_device[d] seconds (then zeroed), named `name`.
  const auto compute_all = [&](const std::string& name, const char* pass) {
    for (std::size_t d = 0; d < n; ++d) {
      if (per_device[d] <= 0.0)
        continue;
      const double from = clock[d];
      advance(d, per_device[d]);
      per_device[d] = 0.0;
      if (!o.traced.empty())
        record(d, name, trace_kind::compute, from, clock[d], {{"pass", pass}, {"simulated", true}});
    }
  };
  // A blocking collective of `seconds` over all devices.
  const auto blocking = [&](const std::string& name, double seconds, const char* pass) {
    if (!(seconds > 0.0) || n < 2)
      return;
    const double s = *std::max_element(clock.begin(), clock.end());
    const double e = stream.contend(s, seconds);
    for (std::size_t d = 0; d < n; ++d) {
      r.waiting[d] += s - clock[d];
      r.communication[d] += e - s;
      if (!o.traced.empty())
        record(d, name, trace_kind::communication, s, e, {{"pass", pass}, {"simulated", true}});
      clock[d] = e;
    }
  };
  // Seconds of one small all-reduce (the loss, the gradient norm).
  const collective_cost_model curves = m.cluster().cost_model();
  const auto small_all_reduce = [&](double bytes) {
    const alpha_beta ab = curves.params(collective::all_reduce, uneven_algorithm::native, bytes);
    return std::max(0.0, ab.alpha) + ab.beta * bytes;
  };
  // A step's op: `part` of its forward + backward work on each device.
  const shard_times* const measured =
      o.measured != nullptr && o.measured->seconds.size() == n && o.measured->optimizer.size() == n
          ? o.measured
          : nullptr;
  // Device d's time for `seconds` measured on the measuring device, for work of class `cls`.
  const auto converted = [&](double seconds, std::size_t d, op_class cls) {
    return seconds * m.device_rate(measured->device, cls) / m.device_rate(d, cls);
  };
  const auto op_work = [&](const synth::plan_step& s, double part) {
    if (measured != nullptr && s.node < measured->seconds[0].size() &&
        measured->seconds[0][s.node] >= 0.0) {
      const op_class cls = synth::op_class_of(g[s.node].kind);
      for (std::size_t d = 0; d < n; ++d)
        per_device[d] += converted(measured->seconds[d][s.node] * part, d, cls);
      return;
    }
    const double flops = m.rule_flops(s.node, s.rule) * part;
    const std::vector<double>* share = work_shares(s.node, s.rule);
    const double f = m.fixed_share(s.node, s.rule);
    const op_class cls = synth::op_class_of(g[s.node].kind);
    for (std::size_t d = 0; d < n; ++d)
      per_device[d] +=
          flops / m.device_rate(d, cls) * (share != nullptr ? f + (1.0 - f) * (*share)[d] : 1.0);
  };
  // The seconds of transfer t's collective one instruction runs: an FSDP copy is gathered for
  // the forward, gathered again before its reader's backward and its gradient reduce-scattered
  // (a third each); any other collective's forward and its dual are half each.
  const auto collective_part = [&](const transfer& t) {
    if (!synth::is_collective(t.kind))
      return 0.0;
    return (m.is_gathered_parameter(t) ? 1.0 / 3.0 : 0.5) * m.comm_max(t, ratios, range);
  };
  const auto rule_collectives = [&](const synth::plan_step& s) {
    return 0.5 * synth::max_at(m.rule_comm(s.node, s.rule, ratios), ratios).first;
  };

  // The rank's step program (every rank of a one-level plan runs the same list): lowered for
  // device 0 and ordered as the executor orders it, with its buckets and recomputation.
  const program::local_program lp = program::lower(g, p, 0);
  program::step_options so;
  so.bucket_bytes = static_cast<std::size_t>(std::max(1.0, o.bucket_bytes));
  so.element_bytes = o.element_bytes;
  so.recompute = o.recompute.value_or(p.recompute);
  const program::step_program sp = program::build(lp, g, so);
  std::vector<std::size_t> step_of(lp.local.size(), p.steps.size()); // local op -> plan step
  {
    std::vector<std::size_t> by_node(g.size(), p.steps.size());
    for (std::size_t k = 0; k < p.steps.size(); ++k)
      by_node[p.steps[k].node] = k;
    for (graph::node_id i = 0; i < lp.local.size(); ++i)
      if (!lp.transfer_of[i])
        step_of[i] = by_node[lp.global[i]];
  }
  // The optimizer over each device's parameters (its shard of a sharded one).
  const auto optimizer = [&](const std::string& what) {
    for (std::size_t d = 0; measured != nullptr && d < n; ++d)
      per_device[d] += converted(measured->optimizer[d], d, op_class::optimizer);
    for (const program::lowered_transfer& lt : lp.transfers) {
      const transfer& t = lt.what;
      if (measured != nullptr || t.kind != transfer_kind::load || !m.is_parameter(t.tensor))
        continue;
      const double flops = m.optimizer_flops(t.tensor);
      const std::vector<double>* share =
          t.to.is_split() ? &shares(m.segments().of(t.tensor, t.to.dim()), t.tensor, t.to.dim())
                          : nullptr;
      for (std::size_t d = 0; d < n; ++d)
        per_device[d] +=
            flops / m.device_rate(d, op_class::optimizer) * (share != nullptr ? (*share)[d] : 1.0);
    }
    compute_all(what, "optimizer");
  };

  // ---- the step program, instruction by instruction ---------------------------------------------
  const auto backward_end = [&] { r.backward = *std::max_element(clock.begin(), clock.end()); };
  double gradients_done = 0.0;
  for (std::size_t k = 0; k < sp.code.size(); ++k) {
    using program::code;
    const program::instruction& in = sp.code[k];
    const std::string what =
        o.traced.empty() && !o.names ? std::string{} : program::name(in, lp, g);
    if (o.names)
      r.program.push_back(what);
    const auto step = [&]() -> const synth::plan_step& { return p.steps[step_of.at(in.node)]; };
    switch (in.op) {
    case code::forward:
    case code::replay:
      if (in.op == code::replay && program::is_moved(lp, in.node)) {
        blocking(what, collective_part(program::transfer_at(lp, in.node)), "replay");
        break;
      }
      blocking(what, rule_collectives(step()), in.op == code::forward ? "forward" : "replay");
      op_work(step(), m.forward_fraction(step().node));
      compute_all(what, in.op == code::forward ? "forward" : "replay");
      break;
    case code::move:
      blocking(what, collective_part(program::transfer_at(lp, in.node)), "forward");
      break;
    case code::regather:
      blocking(what, collective_part(program::transfer_at(lp, in.node)), "backward");
      break;
    case code::backward:
      op_work(step(), 1.0 - m.forward_fraction(step().node));
      compute_all(what, "backward");
      blocking(what, rule_collectives(step()), "backward");
      backward_end();
      break;
    case code::move_back:
      blocking(what, collective_part(program::transfer_at(lp, in.node)), "backward");
      backward_end();
      break;
    case code::loss:
      blocking(what, small_all_reduce(8.0), "forward");
      r.forward = *std::max_element(clock.begin(), clock.end());
      break;
    case code::post: {
      double seconds = 0.0;
      for (graph::node_id w : sp.buckets[in.bucket].params)
        seconds += m.comm_max(program::transfer_at(lp, w), ratios, range);
      stream.post(*std::max_element(clock.begin(), clock.end()), seconds);
      r.gradient_seconds += seconds;
      ++r.buckets;
      break;
    }
    case code::sfb: {
      const transfer& t = program::transfer_at(lp, in.node);
      blocking(what, m.comm_max(t, ratios, range), "backward");
      const synth::device_costs c = m.transfer_compute(t); // its full dW (the optimizer: below)
      const double opt = m.optimizer_flops(t.tensor);
      for (std::size_t d = 0; d < n; ++d)
        per_device[d] += std::max(0.0, synth::value_at(c[d], ratios, d) -
                                           opt / m.device_rate(d, op_class::optimizer));
      compute_all(what, "backward");
      break;
    }
    case code::wait:
      gradients_done = stream.done();
      r.gradient_exposed = std::max(0.0, gradients_done - r.backward);
      for (std::size_t d = 0; d < n; ++d) {
        if (gradients_done > clock[d]) {
          if (!o.traced.empty())
            record(d, what, trace_kind::communication, clock[d], gradients_done,
                   {{"simulated", true}});
          r.waiting[d] += gradients_done - clock[d];
          clock[d] = gradients_done;
        }
      }
      for (std::size_t t = 0; t < o.traced.size(); ++t)
        for (const auto& b : stream.q)
          r.timelines[t].add_at("all_reduce gradients", trace_kind::in_flight, b.start * 1e6,
                                (b.end - b.start) * 1e6, {{"simulated", true}});
      break;
    case code::norm:
      blocking(what, small_all_reduce(8.0), "optimizer");
      break;
    case code::update:
      optimizer(what);
      break;
    }
  }

  r.end = clock;
  const auto last = std::max_element(clock.begin(), clock.end());
  r.step_time = *last;
  r.slowest = static_cast<std::size_t>(last - clock.begin());
  return r;
}

/// The simulated step as the synthesizer's second opinion (synth_options::judge): its final
/// candidates are weighed by it where it disagrees with the additive cost model.
[[nodiscard]] inline std::function<double(const synth::plan&, const synth::cost_model&)>
judge(options o = {}) {
  o.traced.clear();
  return
      [o](const synth::plan& p, const synth::cost_model& m) { return simulate(p, m, o).step_time; };
}

/// The simulated timelines of `r` as one trace file (exec/trace.hpp's format): a process per
/// traced device, named after its device.
[[nodiscard]] inline nlohmann::json trace_of(const result& r, const options& o, const cluster& c,
                                             nlohmann::json metadata = {}) {
  std::vector<nlohmann::json> ranks;
  for (std::size_t k = 0; k < o.traced.size(); ++k)
    ranks.push_back(r.timelines.at(k).events_json(static_cast<int>(o.traced[k]),
                                                  c.devices.at(o.traced[k]).name));
  return chrome_trace(ranks, std::move(metadata));
}

} // namespace hspmd::sim
