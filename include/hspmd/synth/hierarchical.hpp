#pragma once
// Two-level (hierarchical) plans: a one-level program inside every node, data parallelism with
// uneven batch shares across nodes.
//
//   level 1 (inside a node)  any one-level program (synth, DP-CP, TP; FSDP where memory needs
//                            it) over the node's devices, at ratios of its own: mixed GPUs in a
//                            node get their share;
//   level 2 (across nodes)   the batch split by rows, each node's share set by its speed and
//                            memory; every parameter replicated across nodes, its gradient
//                            all-reduced between the devices at the same position in every
//                            node (the composed collective: the intra-node gradient sync, then
//                            an inter-node all-reduce of 1/L of it per device, then an
//                            intra-node all-gather; a split parameter's shard goes straight
//                            across).
//
// Every node runs the same program (the same steps and collectives), lowered for its own
// batch and ratios, so positions line up across nodes. How it is found (docs/synthesis.md,
// "Hierarchical plans"): the one-level search proposes programs for one node of each node
// class (nodes with the same devices) and the DP-CP and TP baselines; for each, every node
// class's step time and memory are fitted as lines in the node's batch (the ratio LP solved at
// each point), and the batch is shared out across nodes so that the slowest node is as fast as
// possible within every device's memory (water-filling on the fitted lines, then whole rows,
// then exact evaluation). The fastest program wins.
#include <hspmd/synth/synthesize.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::synth {

/// A two-level plan (see the file comment).
struct hierarchical_plan {
  std::string model;
  std::string strategy; ///< "hier:" + the inner program's strategy, e.g. "hier:tp"
  std::string cluster_name;
  std::uint64_t cluster_fingerprint = 0;
  std::size_t batch = 0;                       ///< rows of the whole batch
  std::vector<std::vector<std::size_t>> nodes; ///< each node's devices (= ranks), in order
  /// Rows of the batch each node trains on; 0: the node sits the plan out (its devices cannot
  /// hold one row of the node program: they idle and hold nothing).
  std::vector<std::size_t> node_batch;
  std::vector<std::size_t> node_variant; ///< each node's entry of `variants` (`none`: sits out)
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  /// The inner plans: the node program lowered for one (node class, node batch); a node's
  /// plan is `variants[node_variant[k]]` (its device names are the class's first node's).
  std::vector<plan> variants;
  double inner_time = 0.0;    ///< the slowest node's predicted step (seconds)
  double cross_time = 0.0;    ///< the inter-node gradient all-reduce (seconds, not overlapped)
  double step_time = 0.0;     ///< inner_time + cross_time
  std::vector<double> memory; ///< predicted bytes per device (cluster order)
  double seconds = 0.0;       ///< synthesis wall time

  [[nodiscard]] const plan& node_plan(std::size_t k) const {
    if (node_variant.at(k) == none)
      throw plan_error("hierarchical plan of " + cluster_name,
                       "node " + std::to_string(k) + " sits the plan out (0 rows)",
                       "ask active(k) before node_plan(k)");
    return variants.at(node_variant[k]);
  }
  /// Whether node k trains (holds rows); the others idle.
  [[nodiscard]] bool active(std::size_t k) const { return node_batch.at(k) > 0; }
  /// The nodes that train.
  [[nodiscard]] std::size_t active_nodes() const {
    return static_cast<std::size_t>(
        std::count_if(node_batch.begin(), node_batch.end(), [](std::size_t r) { return r > 0; }));
  }
  /// FNV-1a over what every rank must agree on (node batches, device grouping and every inner
  /// plan's hash).
  [[nodiscard]] std::uint64_t hash() const {
    std::string s = strategy + "|" + std::to_string(batch) + "|" + cluster_name;
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      s += "|" + std::to_string(node_batch[k]) + ":" +
           (active(k) ? std::to_string(node_plan(k).hash()) : std::string("-"));
      for (std::size_t d : nodes[k])
        s += "," + std::to_string(d);
    }
    return fnv1a64(s);
  }
};

/// What to try.
struct hierarchical_options {
  synth_options inner;                                            ///< for the one-level searches
  std::vector<std::string> strategies = {"synth", "dp-cp", "tp"}; ///< inner programs to try
  /// A* budget of each node program's search in states expanded (the smaller of this and
  /// `inner.search.max_expansions`): a node's few rows make near-ties that the exact search
  /// spends seconds on (BERT-large, 8 T4s, 5 rows: 5.9 s, 467k states). A count, not a time,
  /// so every rank finds the same program.
  std::size_t node_search_expansions = 20'000;
  /// Node classes (nodes with the same devices) a node program is searched on, those with the
  /// most rows first; the others run one of those programs (every node runs the same program,
  /// each lowered at its own ratios).
  std::size_t class_searches = static_cast<std::size_t>(-1);
  /// Search a class's node program at its rows rounded down to a power of two (the program is
  /// then fitted at the rows it gets): alike stages of several candidates meet the same search.
  bool power_of_two_rows = false;
  /// Makes a node program: by synthesis (its last argument "synth") or a baseline ("dp-cp",
  /// "dp-ev", "tp"); empty: `synthesize` or `make_baseline`. A caller that plans many alike (a
  /// pipeline's stages) passes one that remembers them.
  std::function<plan(const graph::graph&, const cluster&, const synth_options&, const std::string&,
                     const std::string&)>
      node_program;
};

/// Traces the model for a batch of `rows` (e.g. `models::trace_model` bound to a model).
using graph_for_batch = std::function<graph::graph(std::size_t rows)>;

/// `trace`'s graphs by row count, each traced once (references stay valid while it lives).
class graphs_by_rows {
public:
  explicit graphs_by_rows(graph_for_batch trace) : trace_(std::move(trace)) {}
  [[nodiscard]] const graph::graph& operator()(std::size_t rows) {
    auto it = graphs_.find(rows);
    if (it == graphs_.end())
      it = graphs_.emplace(rows, trace_(rows)).first;
    return it->second;
  }
  /// graph_hash of the graph at `rows`, taken once.
  [[nodiscard]] std::uint64_t hash(std::size_t rows) {
    auto it = hashes_.find(rows);
    if (it == hashes_.end())
      it = hashes_.emplace(rows, graph_hash((*this)(rows))).first;
    return it->second;
  }

private:
  graph_for_batch trace_;
  std::map<std::size_t, graph::graph> graphs_;
  std::map<std::size_t, std::uint64_t> hashes_;
};

namespace detail {

// The nodes of `c` as device lists, and the sub-cluster of each node's devices (its intra-node
// link, no inter-node one). Throws `plan_error` when a two-level plan cannot apply.
struct node_layout {
  std::vector<std::vector<std::size_t>> nodes;
  std::vector<std::size_t> node_class;  // class of each node
  std::vector<std::size_t> class_first; // first node of each class
};

[[nodiscard]] inline node_layout layout_nodes(const cluster& c) {
  node_layout out;
  const std::vector<std::int64_t> ids = c.nodes();
  for (std::int64_t id : ids) {
    out.nodes.emplace_back();
    for (std::size_t d = 0; d < c.size(); ++d)
      if (c.devices[d].node == id)
        out.nodes.back().push_back(d);
  }
  if (out.nodes.size() < 2)
    throw plan_error(c.source + ": field devices", "all devices are in one node",
                     "a two-level plan needs devices in two nodes or more; use the one-level "
                     "plan");
  for (std::size_t k = 1; k < out.nodes.size(); ++k)
    if (out.nodes[k].size() != out.nodes[0].size())
      throw plan_error(c.source + ": field devices",
                       "node " + std::to_string(ids[k]) + " has " +
                           std::to_string(out.nodes[k].size()) + " devices but node " +
                           std::to_string(ids[0]) + " has " + std::to_string(out.nodes[0].size()),
                       "a two-level plan pairs the devices at the same position in every node: "
                       "give every node the same device count, or use the one-level plan");
  if (!c.inter_node)
    throw config_error(c.source + ": field links.inter_node", "missing",
                       "a link between nodes, since devices span several nodes");
  // Nodes with the same devices (speeds, rates, memory, in order) form a class.
  std::map<std::string, std::size_t> classes;
  for (std::size_t k = 0; k < out.nodes.size(); ++k) {
    std::string key;
    for (std::size_t d : out.nodes[k]) {
      const device_spec& s = c.devices[d];
      key += std::to_string(s.speed) + "/" + std::to_string(s.bf16_speed) + "/" +
             std::to_string(s.memory) + "/" + std::to_string(s.slowdown);
      for (double r : s.rates)
        key += "/" + std::to_string(r);
      key += ";";
    }
    const auto [it, fresh] = classes.try_emplace(key, out.class_first.size());
    if (fresh)
      out.class_first.push_back(k);
    out.node_class.push_back(it->second);
  }
  return out;
}

[[nodiscard]] inline cluster node_cluster(const cluster& c, const std::vector<std::size_t>& devs) {
  cluster s;
  s.name = c.name + "/node" + std::to_string(c.devices[devs.front()].node);
  s.source = c.source;
  s.intra_node = c.intra_node;
  s.overlap = c.overlap;
  for (std::size_t d : devs)
    s.devices.push_back(c.devices[d]);
  return s;
}

// The inner program `prog` on one node (cluster `sub`) at `rows` rows: ratios from the LP
// (speed-proportional where it finds none), evaluated. Memory over a device's capacity marks
// the result infeasible (`fits` false).
struct node_fit {
  plan p;
  bool fits = false;
};

[[nodiscard]] inline node_fit fit_node(const plan& prog, const graph::graph& g, const cluster& sub,
                                       const synth_options& opt, std::uint64_t hash) {
  cost_model m(g, sub, segment_map(g, opt.segments), std::nullopt, opt.gemm_type);
  // (a pipeline stage's node program: its micro-batches in flight and its received values)
  m.set_activation_copies(opt.activation_copies);
  if (opt.received)
    m.set_received(opt.received->inputs, opt.received->link, opt.received->sharing);
  node_fit f;
  f.p = prog;
  f.p.graph_hash = hash; // (graph_hash(g), taken once per row count by the caller)
  f.p.graph_nodes = g.size();
  f.p.cluster_name = sub.name;
  f.p.cluster_fingerprint = fingerprint(sub);
  f.p.device_names.clear();
  for (const device_spec& d : sub.devices)
    f.p.device_names.push_back(d.name);
  ratio_table r = proportional_ratios(sub, m.segments().count());
  evaluate(f.p, m, r);
  if (opt.solve_lp && sub.size() > 1) {
    const ratio_solution sol = solve_ratios(ratio_problem_of(f.p, m, r));
    if (sol.status == lp::status::optimal) {
      plan moved = f.p;
      evaluate(moved, m, sol.ratios);
      if (moved.step_time <= f.p.step_time)
        f.p = std::move(moved);
    }
  }
  try { // memory at the whole shards lowering cuts (a node's few rows over its devices)
    fit_whole_shards(f.p, m);
  } catch (const plan_error&) {
    // f.p.memory holds the whole-shard need; a device is over
  }
  f.fits = true;
  for (std::size_t d = 0; d < sub.size(); ++d)
    f.fits = f.fits && f.p.memory[d] <= static_cast<double>(sub.devices[d].memory);
  return f;
}

// Worst-device memory headroom as a line in the rows: the largest row count whose fitted
// memory stays within every device's capacity.
[[nodiscard]] inline double rows_that_fit(const plan& a, const plan& b, double ra, double rb,
                                          const cluster& sub) {
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t d = 0; d < sub.size(); ++d) {
    const double slope = (b.memory[d] - a.memory[d]) / (rb - ra);
    const double cap = static_cast<double>(sub.devices[d].memory);
    if (slope > 0.0)
      best = std::min(best, ra + (cap - a.memory[d]) / slope);
    else if (a.memory[d] > cap)
      best = std::min(best, 0.0);
  }
  return best;
}

} // namespace detail

/// Seconds of the inter-node gradient all-reduce of a two-level plan: every device at position
/// i all-reduces 1/L of the node's gradient bytes (or its shard) with position i of every
/// other node, the L rings sharing each node's link: a ring all-reduce of all gradient bytes
/// over the nodes. Each parameter pays min(1, bytes / `gradient_bucket_bytes`) latencies, the
/// rule by which the one-level model prices a gradient all-reduce (and by which the one-level
/// executor's buckets call it), so the two compare like for like; the two-level executor packs
/// 16 MiB per call (BERT-large: 87 calls where this prices about 160).
[[nodiscard]] inline double cross_node_seconds(const graph::graph& g, const cluster& c,
                                               std::size_t node_count) {
  double bytes = 0.0;
  double buckets = 0.0;
  for (graph::node_id p : g.parameters()) {
    const auto b = static_cast<double>(g[p].out.size() * size_of(g[p].type));
    bytes += b;
    buckets += std::min(1.0, b / gradient_bucket_bytes);
  }
  const auto n = static_cast<double>(node_count);
  const link_spec& l = *c.inter_node;
  return buckets * 2.0 * (n - 1.0) * l.latency + 2.0 * (n - 1.0) / n * bytes / l.bandwidth;
}

/// Synthesizes a two-level plan for the model `trace` traces, `batch` rows in all, on cluster
/// `c` (see the file comment). Throws `plan_error` when no inner program fits every node at
/// any batch share, naming the closest.
[[nodiscard]] inline hierarchical_plan synthesize_hierarchical(const graph_for_batch& trace,
                                                               std::size_t batch, const cluster& c,
                                                               const hierarchical_options& opt = {},
                                                               std::string model = "model") {
  const auto start = std::chrono::steady_clock::now();
  const detail::node_layout lay = detail::layout_nodes(c);
  const std::size_t n_nodes = lay.nodes.size();
  if (batch < n_nodes)
    throw plan_error("hierarchical plan",
                     "a batch of " + std::to_string(batch) + " rows for " +
                         std::to_string(n_nodes) + " nodes",
                     "at least one row per node");
  std::vector<cluster> subs;
  for (std::size_t k : lay.class_first)
    subs.push_back(detail::node_cluster(c, lay.nodes[k]));
  graphs_by_rows graph_at(trace);
  // Each class's rows in proportion to its node's speed: where its program is searched and
  // its lines are fitted.
  std::vector<std::size_t> class_rows;
  {
    double total = 0.0;
    std::vector<double> speed(subs.size(), 0.0);
    for (std::size_t k = 0; k < subs.size(); ++k)
      for (const device_spec& d : subs[k].devices)
        speed[k] += d.speed;
    for (std::size_t k = 0; k < n_nodes; ++k)
      total += speed[lay.node_class[k]];
    for (std::size_t k = 0; k < subs.size(); ++k)
      class_rows.push_back(std::max<std::size_t>(
          1, static_cast<std::size_t>(std::llround(double(batch) * speed[k] / total))));
  }

  // Candidate node programs.
  std::vector<plan> programs;
  const auto add = [&](plan p) {
    for (const plan& q : programs)
      if (q.steps == p.steps && q.recompute == p.recompute)
        return;
    programs.push_back(std::move(p));
  };
  synth_options inner = opt.inner;
  inner.search.max_expansions = std::min(inner.search.max_expansions, opt.node_search_expansions);
  // The node's rows are re-fitted below with the LP at every point anyway: two search <-> LP
  // rounds, not eight (under tight memory each round's search retries keeping memory-cost
  // trade-offs, then with sharded parameters: up to four budgeted searches per round).
  inner.max_rounds = std::min<std::size_t>(inner.max_rounds, 2);
  // A class whose rows do not fit gives no program (the others' programs cover it, and the
  // water-filling moves rows off it) rather than a memory-Pareto search that costs seconds.
  inner.search.pareto_retry = false;
  inner.judge = nullptr; // node programs are weighed by the cost model (one-level simulation)
  std::string why_none;
  const auto attempt = [&](auto&& make) {
    try {
      add(make());
      return true;
    } catch (const plan_error& e) {
      why_none = e.what();
      return false;
    }
  };
  for (const std::string& s : opt.strategies) {
    if (s == "synth") {
      // A program for each class's node; where its speed-proportional rows do not fit, at
      // half and a quarter of them (the water-filling then gives it fewer).
      std::vector<std::size_t> order(subs.size()); // (the classes with the most rows first)
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::ranges::stable_sort(
          order, [&](std::size_t a, std::size_t b) { return class_rows[a] > class_rows[b]; });
      if (order.size() > opt.class_searches)
        order.resize(std::max<std::size_t>(opt.class_searches, 1));
      for (std::size_t k : order)
        for (std::size_t rows = opt.power_of_two_rows ? std::bit_floor(class_rows[k])
                                                      : class_rows[k],
                         tries = 0;
             tries < 3; rows = std::max<std::size_t>(1, rows / 2), ++tries) {
          if (attempt([&] {
                return opt.node_program ? opt.node_program(graph_at(rows), subs[k], inner, model, s)
                                        : synthesize(graph_at(rows), subs[k], inner, model);
              }) ||
              rows == 1)
            break;
        }
    } else if (s == "dp-cp" || s == "dp-ev" || s == "tp") {
      const baseline b = s == "tp"      ? baseline::tp
                         : s == "dp-ev" ? baseline::dp_ev
                                        : baseline::dp_cp;
      // On the class with the most rows (the tightest memory, as a rule).
      std::size_t k = 0;
      for (std::size_t j = 1; j < subs.size(); ++j)
        if (class_rows[j] > class_rows[k])
          k = j;
      // (at its own rows: a baseline is no search worth sharing, and at a power of two
      // BERT-large's pipeline pick at 1024 devices came out 1.7 % slower)
      const graph::graph& at = graph_at(class_rows[k]);
      attempt([&] {
        return opt.node_program ? opt.node_program(at, subs[k], inner, model, s)
                                : make_baseline(at, subs[k], b, inner, model);
      });
    } else {
      throw plan_error("hierarchical plan", "unknown inner strategy \"" + s + "\"",
                       "use synth, dp-cp, dp-ev or tp");
    }
  }

  hierarchical_plan best;
  bool have = false;
  std::string closest;
  double best_capacity = -1.0;
  for (const plan& prog : programs) {
    // Each class's step time and memory as lines in the rows (two points, the class's
    // speed-proportional rows and twice them); the water level t gives each node (t - a) / b
    // rows, capped by memory.
    std::vector<double> a(subs.size());
    std::vector<double> slope(subs.size());
    std::vector<double> cap(subs.size());
    for (std::size_t k = 0; k < subs.size(); ++k) {
      const std::size_t r0 = class_rows[k];
      const std::size_t r1 = 2 * r0;
      const detail::node_fit f0 =
          detail::fit_node(prog, graph_at(r0), subs[k], opt.inner, graph_at.hash(r0));
      const detail::node_fit f1 =
          detail::fit_node(prog, graph_at(r1), subs[k], opt.inner, graph_at.hash(r1));
      slope[k] = std::max(1e-300, (f1.p.step_time - f0.p.step_time) / double(r1 - r0));
      a[k] = f0.p.step_time - slope[k] * double(r0);
      cap[k] = std::max(
          0.0, std::floor(detail::rows_that_fit(f0.p, f1.p, double(r0), double(r1), subs[k])));
    }
    double capacity = 0.0;
    for (std::size_t k = 0; k < n_nodes; ++k)
      capacity += std::min(cap[lay.node_class[k]], double(batch));
    if (capacity < double(batch)) {
      if (capacity >= best_capacity) { // name the program that came closest, and its classes
        best_capacity = capacity;
        closest = prog.strategy + " inside a node holds " +
                  std::to_string(static_cast<long long>(std::max(0.0, capacity))) + " of " +
                  std::to_string(batch) + " rows within the devices' memory (rows per node:";
        for (std::size_t k = 0; k < subs.size(); ++k)
          closest += (k == 0 ? " " : ", ") + subs[k].devices.front().kind + " " +
                     std::to_string(static_cast<long long>(std::max(0.0, cap[k])));
        closest += ")";
      }
      continue;
    }
    // A node takes at least one row, unless not even one fits its devices: then it sits out.
    const auto rows_at = [&](double t, std::size_t k) {
      const std::size_t cls = lay.node_class[k];
      return std::clamp((t - a[cls]) / slope[cls], std::min(1.0, cap[cls]), cap[cls]);
    };
    double lo = 0.0;
    double hi = 1.0;
    const auto total_at = [&](double t) {
      double s = 0.0;
      for (std::size_t k = 0; k < n_nodes; ++k)
        s += rows_at(t, k);
      return s;
    };
    while (total_at(hi) < double(batch))
      hi *= 2.0;
    for (int it = 0; it < 200; ++it) {
      const double mid = 0.5 * (lo + hi);
      (total_at(mid) < double(batch) ? lo : hi) = mid;
    }
    // Whole rows: floors, then the rest one row at a time to the node that ends soonest.
    std::vector<std::size_t> rows(n_nodes);
    std::size_t given = 0;
    for (std::size_t k = 0; k < n_nodes; ++k) {
      rows[k] = static_cast<std::size_t>(std::floor(rows_at(hi, k)));
      given += rows[k];
    }
    while (given > batch) { // the floors of capped shares can overshoot by rounding
      std::size_t k = 0;
      for (std::size_t j = 1; j < n_nodes; ++j)
        if (rows[j] > rows[k])
          k = j;
      --rows[k];
      --given;
    }
    while (given < batch) {
      std::size_t pick = n_nodes;
      double soonest = std::numeric_limits<double>::infinity();
      for (std::size_t k = 0; k < n_nodes; ++k) {
        const std::size_t cls = lay.node_class[k];
        if (double(rows[k] + 1) > cap[cls])
          continue;
        const double t = a[cls] + slope[cls] * double(rows[k] + 1);
        if (t < soonest) {
          soonest = t;
          pick = k;
        }
      }
      if (pick == n_nodes)
        break;
      ++rows[pick];
      ++given;
    }
    if (given != batch)
      continue;
    // Exact evaluation of each (class, rows).
    hierarchical_plan h;
    h.model = model;
    h.strategy = "hier:" + prog.strategy;
    h.cluster_name = c.name;
    h.cluster_fingerprint = fingerprint(c);
    h.batch = batch;
    h.nodes = lay.nodes;
    h.node_batch = rows;
    h.memory.assign(c.size(), 0.0);
    std::map<std::pair<std::size_t, std::size_t>, std::size_t> variant_of;
    bool fits = true;
    for (std::size_t k = 0; k < n_nodes && fits; ++k) {
      const std::size_t cls = lay.node_class[k];
      if (rows[k] == 0) {
        h.node_variant.push_back(hierarchical_plan::none);
        continue;
      }
      auto [it, fresh] = variant_of.try_emplace({cls, rows[k]}, h.variants.size());
      if (fresh) {
        detail::node_fit f =
            detail::fit_node(prog, graph_at(rows[k]), subs[cls], opt.inner, graph_at.hash(rows[k]));
        fits = f.fits;
        f.p.strategy = prog.strategy;
        h.variants.push_back(std::move(f.p));
      }
      h.node_variant.push_back(it->second);
      const plan& p = h.variants[it->second];
      h.inner_time = std::max(h.inner_time, p.step_time);
      for (std::size_t i = 0; i < lay.nodes[k].size(); ++i)
        h.memory[lay.nodes[k][i]] = p.memory[i];
    }
    if (!fits) {
      closest = prog.strategy + " inside a node exceeds a device's memory at its batch share";
      continue;
    }
    h.cross_time = cross_node_seconds(graph_at(class_rows.front()), c, h.active_nodes());
    h.step_time = h.inner_time + h.cross_time;
    if (!have || h.step_time < best.step_time) {
      best = std::move(h);
      have = true;
    }
  }
  if (!have)
    throw plan_error("hierarchical plan of " + c.name,
                     programs.empty() ? "no node program: " + why_none
                                      : "no node program fits every node: " + closest,
                     "add devices or memory, shrink the batch, or allow parameter sharding");
  best.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return best;
}

} // namespace hspmd::synth
