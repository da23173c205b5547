#pragma once
// A pipeline stage's SPMD plan over its group, made once for every stage that is the same
// problem: the stage planner (make_pipeline_plan, choose_pipeline) asks `stage_planner::plan`
// for each stage of each candidate, and a stage whose graph has the same structure (the same
// ops, shapes, inputs and attributes; names equal but for their numbers -- layers.3 and
// layers.7 of the same width) on a group of the same devices (kinds, speeds, memory, the same
// node layout; names and node ids aside) under the same options gets the plan made for the
// first, renamed for its own nodes and devices. Equal groups of one kind with as many blocks
// each are one synthesis, whatever the depth; so is the same stage tried again by another
// candidate of a search.
//
//     program::stage_planner planner;
//     const synth::plan s = planner.plan(stage_graph, group, options, "llama.stage3");
//     planner.made();  planner.reused();   // syntheses run, and plans reused
//
// One planner serves one search: the options it is given may differ in recomputation and
// memory checks only (the rest -- profile, load rules -- are taken to be the same).

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/program/two_level_stage.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::program {

/// The devices [first, first + n) of `c` as a cluster of their own (links and costs kept).
[[nodiscard]] inline cluster sub_cluster(const cluster& c, std::size_t first, std::size_t n) {
  cluster out = c;
  out.devices.assign(c.devices.begin() + static_cast<std::ptrdiff_t>(first),
                     c.devices.begin() + static_cast<std::ptrdiff_t>(first + n));
  return out;
}

/// Each stage plan's strategy: the synthesizer, or a baseline.
enum class stage_strategy : std::uint8_t { synth, dp_ev, dp_cp, tp };

/// The strategy named `text` ("synth", "dp-ev", "dp-cp", "tp"); throws `config_error`.
[[nodiscard]] inline stage_strategy parse_stage_strategy(const std::string& text) {
  if (text == "synth")
    return stage_strategy::synth;
  if (text == "dp-ev")
    return stage_strategy::dp_ev;
  if (text == "dp-cp")
    return stage_strategy::dp_cp;
  if (text == "tp")
    return stage_strategy::tp;
  throw config_error("pipeline plan strategy \"" + text + "\"",
                     "not one of synth, dp-ev, dp-cp, tp");
}

/// See the file comment.
class stage_planner {
public:
  /// The plan of stage graph `g` over `group` with `so`, named `model`. Throws what
  /// synth::synthesize or make_baseline throws. With `so.activation_copies` k > 1 (micro-batches
  /// in flight): the plan made for one copy where it holds k within every device's memory (the
  /// synthesizer's pick under a looser limit, so its pick under this one), else one made for k
  /// -- stages that differ only in their micro-batches in flight share a plan where it fits.
  [[nodiscard]] synth::plan plan(const graph::graph& g, const cluster& group,
                                 const synth::synth_options& so, stage_strategy strategy,
                                 const std::string& model) {
    synth::synth_options one = so;
    one.activation_copies = 1.0;
    synth::plan base = made_for(g, group, one, strategy, model);
    if (so.activation_copies == 1.0)
      return base;
    synth::cost_model m(g, group, synth::segment_map(g, base.segments), so.profile, so.gemm_type);
    m.set_activation_copies(so.activation_copies);
    if (so.received)
      m.set_received(so.received->inputs, so.received->link, so.received->sharing);
    synth::evaluate(base, m, base.ratios);
    const std::vector<double> whole = synth::whole_shard_memory(base, m, base.ratios);
    bool fits = true;
    for (std::size_t d = 0; d < group.size() && d < whole.size(); ++d)
      fits = fits && (group.devices[d].memory == 0 ||
                      whole[d] <= static_cast<double>(group.devices[d].memory));
    if (fits || !so.search.check_memory)
      return base;
    return made_for(g, group, so, strategy, model);
  }
  /// A two-level program (two_level_stage.hpp) for stage graph `g` (`at`: the stage's graph at
  /// a row count; `rows`: a micro-batch's) over `group`, holding `held` micro-batches at once,
  /// made or reused as `plan`'s are; none where no node program fits (also remembered).
  [[nodiscard]] std::optional<two_level_stage>
  plan_two_level(const stage_graph_at& at, std::size_t rows, const graph::graph& g,
                 const cluster& group, const synth::synth_options& so, std::size_t held,
                 const std::string& model,
                 std::size_t node_expansions = two_level_node_expansions) {
    // As `plan`: the program made for one micro-batch in flight where it holds `held` within
    // every device's memory (priced again for them), else one made for `held`.
    std::optional<two_level_stage> t =
        two_level_for(at, rows, g, group, so, 1, model, node_expansions);
    if (held == 1 || !t)
      return t;
    synth::graphs_by_rows graphs(at);
    price_two_level_stage(*t, graphs, group, held);
    if (fits_memory(*t, group) || !so.search.check_memory)
      return t;
    return two_level_for(at, rows, g, group, so, held, model, node_expansions);
  }
  /// Syntheses (or baselines) run, and plans reused for a stage that was the same problem.
  [[nodiscard]] std::size_t made() const noexcept { return made_; }
  [[nodiscard]] std::size_t reused() const noexcept { return reused_; }

private:
  // The plan for exactly these options, made or reused.
  // Safe to call from several threads (choose_pipeline plans candidates at once): the table is
  // read and written under a lock, the synthesis runs outside it (two threads that meet one new
  // problem both solve it, alike).
  [[nodiscard]] synth::plan made_for(const graph::graph& g, const cluster& c,
                                     const synth::synth_options& so, stage_strategy strategy,
                                     const std::string& model) {
    const std::uint64_t key = key_of(g, c, so, strategy);
    {
      std::unique_lock lock(mutex_);
      if (const auto hit = plans_.find(key); hit != plans_.end()) {
        ++reused_;
        const synth::plan found = hit->second;
        lock.unlock();
        return renamed(found, g, c, model);
      }
    }
    synth::plan p;
    switch (strategy) {
    case stage_strategy::synth:
      p = synth::synthesize(g, c, so, model);
      break;
    case stage_strategy::dp_ev:
      p = synth::make_baseline(g, c, synth::baseline::dp_ev, so, model);
      break;
    case stage_strategy::dp_cp:
      p = synth::make_baseline(g, c, synth::baseline::dp_cp, so, model);
      break;
    case stage_strategy::tp:
      p = synth::make_baseline(g, c, synth::baseline::tp, so, model);
      break;
    }
    const std::scoped_lock lock(mutex_);
    ++made_;
    plans_.emplace(key, p);
    return p;
  }

  // A name with its digits dropped: layers.3.mlp.up.matmul95 and layers.7.mlp.up.matmul223
  // are the same node of the same block structure.
  [[nodiscard]] static std::string shape_of_name(const std::string& name) {
    std::string out;
    for (char ch : name)
      if (std::isdigit(static_cast<unsigned char>(ch)) == 0)
        out += ch;
    return out;
  }
  [[nodiscard]] static std::uint64_t key_of(const graph::graph& g, const cluster& c,
                                            const synth::synth_options& so,
                                            stage_strategy strategy) {
    // The graph as graph::to_json writes it, names without their digits, in bytes (not JSON:
    // a stage's graph has thousands of nodes and the key is taken for every stage plan).
    std::string text;
    const auto put = [&text](const auto& v) {
      text.append(reinterpret_cast<const char*>(&v), sizeof v);
    };
    const auto put_dims = [&](const std::vector<std::size_t>& d) {
      put(d.size());
      for (std::size_t x : d)
        put(x);
    };
    for (const graph::node& n : g.nodes()) {
      put(n.kind);
      const std::string name = shape_of_name(n.name);
      put(name.size());
      text += name;
      put(n.inputs.size());
      for (graph::node_id i : n.inputs)
        put(i);
      put_dims(n.out.dims);
      put(n.out.batch_dim.value_or(static_cast<std::size_t>(-1)));
      put(n.type);
      put(n.attrs.scalar);
      put_dims(n.attrs.dims);
      put(n.attrs.flag);
      const std::string pin = n.pin ? n.pin->to_string() : std::string("-");
      put(pin.size());
      text += pin;
      put(n.init.how);
      put(n.init.value);
    }
    put(g.loss().value_or(static_cast<graph::node_id>(-1)));
    cluster anonymous = c;
    const std::int64_t first_node = c.devices.empty() ? 0 : c.devices.front().node;
    for (device_spec& d : anonymous.devices) {
      d.name.clear();
      d.node -= first_node;
    }
    anonymous.name.clear();
    anonymous.source.clear();
    text += "|" + to_json(anonymous).dump() + "|" + std::to_string(static_cast<int>(strategy)) +
            "|" + std::to_string(static_cast<int>(so.search.recompute)) + "|" +
            std::to_string(static_cast<int>(so.segments)) + "|" +
            std::to_string(static_cast<int>(so.gemm_type)) + "|" +
            std::to_string(so.search.check_memory) + "|" + std::to_string(so.activation_copies);
    // (the search's own options: node programs search on a smaller budget than stage plans,
    // and a node can be the whole group of another candidate's stage)
    text += "|" + std::to_string(so.max_rounds) + "," + std::to_string(so.solve_lp) + "," +
            std::to_string(so.search.max_expansions) + "," + std::to_string(so.search.max_seconds) +
            "," + std::to_string(so.search.allow_sfb) + "," +
            std::to_string(so.search.allow_all_to_all) + "," +
            std::to_string(so.search.memory_pareto) + "," + std::to_string(so.search.pareto_retry) +
            "," + std::to_string(so.judge != nullptr) + "," +
            std::to_string(so.profile.has_value()) + "," + std::to_string(so.judge_margin);
    if (so.received) {
      text += "|received";
      for (graph::node_id t : so.received->inputs)
        text += "," + std::to_string(t);
      text += "|" + std::to_string(so.received->link.bandwidth) + "," +
              std::to_string(so.received->link.latency) + "," +
              std::to_string(so.received->sharing);
    }
    return fnv1a64(text);
  }
  // `p` (made for a stage of the same structure) for stage graph `g` on `c`.
  [[nodiscard]] static synth::plan renamed(synth::plan p, const graph::graph& g, const cluster& c,
                                           const std::string& model) {
    p.model = model;
    p.graph_hash = synth::graph_hash(g);
    p.graph_nodes = g.size();
    p.cluster_name = c.name;
    p.cluster_fingerprint = fingerprint(c);
    std::map<std::string, std::string> names; // old -> new, devices and nodes
    for (std::size_t d = 0; d < p.device_names.size() && d < c.size(); ++d)
      names[p.device_names[d]] = c.devices[d].name;
    p.device_names.clear();
    for (const device_spec& d : c.devices)
      p.device_names.push_back(d.name);
    for (synth::plan_step& s : p.steps) {
      names[s.name] = g[s.node].name;
      s.name = g[s.node].name;
    }
    // the binding rows in words name devices and nodes: each whole name replaced
    for (std::string& text : p.binding) {
      std::string out;
      for (std::size_t i = 0; i < text.size();) {
        std::size_t e = i;
        while (e < text.size() && (std::isalnum(static_cast<unsigned char>(text[e])) != 0 ||
                                   std::string_view("_.:-").find(text[e]) != std::string::npos))
          ++e;
        if (e == i) {
          out += text[i++];
          continue;
        }
        const std::string token = text.substr(i, e - i);
        const auto to = names.find(token);
        out += to != names.end() ? to->second : token;
        i = e;
      }
      text = std::move(out);
    }
    return p;
  }

  // The two-level program for exactly `held` micro-batches in flight, made or reused.
  [[nodiscard]] std::optional<two_level_stage>
  two_level_for(const stage_graph_at& at, std::size_t rows, const graph::graph& g,
                const cluster& group, synth::synth_options so, std::size_t held,
                const std::string& model, std::size_t node_expansions) {
    so.activation_copies = static_cast<double>(held);
    const std::uint64_t key =
        fnv1a64(std::to_string(key_of(g, group, so, stage_strategy::synth)) + "|two-level|" +
                std::to_string(rows) + "|" + std::to_string(node_expansions));
    {
      std::unique_lock lock(mutex_);
      if (const auto hit = two_level_.find(key); hit != two_level_.end()) {
        ++reused_;
        std::optional<two_level_stage> found = hit->second;
        lock.unlock();
        if (found)
          rename_two_level(*found, g, group, model);
        return found;
      }
    }
    std::optional<two_level_stage> t;
    try {
      // (node programs made or reused as stage plans are: alike nodes of alike stages in
      // several candidates are one synthesis)
      t = plan_two_level_stage(
          at, rows, group, so, held, model,
          [this](const graph::graph& ng, const cluster& node, const synth::synth_options& nso,
                 const std::string& name, const std::string& strategy) {
            return made_for(ng, node, nso, parse_stage_strategy(strategy), name);
          },
          node_expansions);
    } catch (const plan_error&) { // (no node program fits: the stage plans one level)
    }
    const std::scoped_lock lock(mutex_);
    ++made_;
    two_level_.emplace(key, t);
    return t;
  }
  // `t` (made for a stage of the same structure on a group of the same layout) for stage graph
  // `g` on `group`: its node programs renamed for the nodes that run them.
  static void rename_two_level(two_level_stage& t, const graph::graph& g, const cluster& group,
                               const std::string& model) {
    t.plan.model = model;
    t.plan.cluster_name = group.name;
    t.plan.cluster_fingerprint = fingerprint(group);
    for (std::size_t v = 0; v < t.plan.variants.size(); ++v)
      for (std::size_t k = 0; k < t.plan.nodes.size(); ++k)
        if (t.plan.node_variant[k] == v) {
          synth::plan& p = t.plan.variants[v];
          const std::uint64_t hash = p.graph_hash; // (made for the node's rows, not g's)
          const std::size_t nodes = p.graph_nodes;
          p = renamed(std::move(p), g, node_of_group(t, group, k), model);
          p.graph_hash = hash;
          p.graph_nodes = nodes;
          break;
        }
  }

  std::map<std::uint64_t, synth::plan> plans_;
  std::map<std::uint64_t, std::optional<two_level_stage>> two_level_;
  std::size_t made_ = 0, reused_ = 0;
  std::mutex mutex_;
};

} // namespace hspmd::program
