#pragma once
// A plan: the synthesized program (per op: its rule and the loads / collectives fused before
// it), the sharding ratios, and what the cost model predicts. Plans round-trip through JSON,
// hash to a number every rank compares before training, and explain themselves as a table.

#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/io/json_input.hpp>
#include <hspmd/synth/search.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace hspmd::synth {

/// One op of a plan.
struct plan_step {
  graph::node_id node = 0;
  std::string name; ///< the node's name, checked against the graph when a plan is read
  graph::op kind = graph::op::input;
  graph::rule rule;
  std::vector<transfer> transfers; ///< loads and collectives fused before the op
  double compute = 0.0;            ///< seconds, max over devices (at the plan's ratios)
  double comm = 0.0;               ///< seconds, sum over the step's collectives
  std::size_t bottleneck = 0;      ///< the device with the most compute in this step
  friend bool operator==(const plan_step&, const plan_step&) = default;
};

/// How the search went (not part of the plan's identity).
struct plan_stats {
  std::size_t expanded = 0;  ///< A* states expanded, all rounds
  std::size_t generated = 0; ///< A* states generated, all rounds
  std::size_t rounds = 0;    ///< search <-> LP rounds
  double search_seconds = 0.0;
  double lp_seconds = 0.0;
  double gap = 0.0;    ///< (cost - lower bound) / cost of the last search; 0 when optimal
  bool optimal = true; ///< the last search finished within its budgets
  /// The full search found nothing within memory and the plan comes from its data-parallel,
  /// sharded-parameter (FSDP) part (synthesize.hpp).
  bool fsdp_fallback = false;
  /// Where synth_options::judge weighed the candidates: how many (0: no judge), the judge's step
  /// time of this plan, whether it overruled the cost model, and the cost model's own pick's
  /// predicted and judged step times.
  std::size_t judged = 0;
  double judged_step = 0.0;
  bool reranked = false;
  double model_pick_step = 0.0;
  double model_pick_judged = 0.0;
};

/// A synthesized (or baseline) distributed program.
struct plan {
  std::string model;    ///< e.g. "bert"
  std::string strategy; ///< "synth", "dp-ev", "dp-cp", "tp"
  std::uint64_t graph_hash = 0;
  std::size_t graph_nodes = 0;
  std::string cluster_name;
  std::uint64_t cluster_fingerprint = 0;
  std::vector<std::string> device_names;
  segment_policy segments = segment_policy::one;
  std::vector<std::string> segment_names{"batch"};
  ratio_table ratios; ///< [segment][device]
  std::vector<plan_step> steps;
  /// Activation recomputation over the model's blocks (graph/blocks.hpp): priced in the step
  /// time and memory, and run by the executor that trains the plan (its trainer applies it).
  bool recompute = false;
  double step_time = 0.0;     ///< predicted seconds per training step
  double compute_time = 0.0;  ///< its compute part
  double comm_time = 0.0;     ///< its communication part
  double overlap_time = 0.0;  ///< gradient all-reduce hidden behind the backward (subtracted)
  std::vector<double> memory; ///< predicted bytes per device
  std::vector<double> device_compute; ///< predicted compute seconds per device (all steps)
  std::vector<std::string> binding;   ///< the ratio LP's binding rows, in words
  plan_stats stats;

  /// FNV-1a of the canonical JSON without the search statistics: equal on every rank that
  /// synthesized the same plan for the same graph and cluster.
  [[nodiscard]] std::uint64_t hash() const;
};

/// Hash of a traced graph (its canonical JSON).
[[nodiscard]] inline std::uint64_t graph_hash(const graph::graph& g) {
  return fnv1a64(graph::to_json(g).dump());
}

namespace detail {

[[nodiscard]] inline std::string family_name(graph::rule::family f) {
  switch (f) {
  case graph::rule::family::replicated:
    return "replicated";
  case graph::rule::family::split:
    return "split";
  case graph::rule::family::linear:
    return "linear";
  case graph::rule::family::expert:
    return "expert";
  }
  return "replicated";
}

} // namespace detail

namespace detail {
[[nodiscard]] inline bool is_view(const cost_model& m, graph::node_id id) {
  return m.is_view(id);
}
} // namespace detail

/// The most bytes of FSDP-gathered parameter copies alive at once over a plan's steps (the same
/// on every device: the copies are whole). A copy lives from the step whose transfers gather
/// it to the last step that reads it, a view of it, or a version made from it: what
/// exec::distributed_executor shares one buffer for (and gathers again in the backward).
[[nodiscard]] inline double gathered_parameter_peak(const std::vector<plan_step>& steps,
                                                    const cost_model& m) {
  const graph::graph& g = m.graph();
  struct life {
    std::size_t from, to;
    double bytes;
  };
  std::vector<life> lives;
  // Each copy and each view of one, (tensor, placement code) -> its life. One pass over the
  // steps: a step's own gathers first, then what it reads extends the lives it reads.
  std::map<std::pair<graph::node_id, std::size_t>, std::size_t> alias;
  const auto life_of = [&](graph::node_id x, placement p) -> life* {
    const auto it = alias.find({x, code_of(p)});
    return it == alias.end() ? nullptr : &lives[it->second];
  };
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const plan_step& st = steps[s];
    for (const transfer& t : st.transfers)
      if (m.is_gathered_parameter(t) &&
          alias.emplace(std::pair{t.tensor, code_of(t.to)}, lives.size()).second)
        lives.push_back({s, s, m.working_copy_bytes(t.tensor)});
    const auto& ins = g[st.node].inputs;
    std::optional<std::size_t> viewed; // the life a view step reads
    for (std::size_t k = 0; k < ins.size() && k < st.rule.arity; ++k)
      if (life* l = life_of(ins[k], st.rule.in[k])) {
        l->to = s;
        viewed = alias.at({ins[k], code_of(st.rule.in[k])});
      }
    for (const transfer& o : st.transfers)
      if (o.kind != transfer_kind::load)
        if (life* l = life_of(o.tensor, o.from)) {
          l->to = s;
          viewed = alias.at({o.tensor, code_of(o.from)});
        }
    if (viewed && detail::is_view(m, st.node))
      alias.emplace(std::pair{st.node, code_of(st.rule.out)}, *viewed);
  }
  // The most bytes alive at once: sweep the lives' starts and ends.
  std::vector<std::pair<std::size_t, double>> events; // (step, +bytes at from / -bytes after to)
  for (const life& l : lives) {
    events.emplace_back(2 * l.from, l.bytes);
    events.emplace_back(2 * l.to + 1, -l.bytes);
  }
  std::ranges::sort(events, [](const auto& x, const auto& y) { return x.first < y.first; });
  double peak = 0.0;
  double live = 0.0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    live += events[i].second;
    if (i + 1 == events.size() || events[i + 1].first != events[i].first)
      peak = std::max(peak, live);
  }
  return peak;
}

namespace detail {
/// The share of a step's compute that is its backward (a product's two backward GEMMs to the
/// forward's one).
inline constexpr double backward_share = 2.0 / 3.0;

/// Seconds of gradient all-reduce that a perfect overlap would hide: the backward runs the
/// steps in reverse (each for `backward_share` of its compute), a parameter's gradient is final
/// after the backward of the step that loads it (its first reader), and the all-reduces run one
/// after another from then on (exec/distributed.hpp's buckets); what ends after the backward is
/// exposed, the rest hidden.
[[nodiscard]] inline double hideable_gradient_time(const plan& p, const cost_model& m,
                                                   const ratio_table& ratios) {
  double t = 0.0;
  double queue_end = 0.0;
  double total = 0.0;
  for (auto s = p.steps.rbegin(); s != p.steps.rend(); ++s) {
    t += backward_share * m.compute_max(s->node, s->rule, ratios);
    for (const transfer& tr : s->transfers)
      if (m.is_gradient_all_reduce(tr)) {
        const double c = m.comm_max(tr, ratios);
        queue_end = std::max(queue_end, t) + c;
        total += c;
      }
  }
  return std::max(0.0, total - std::max(0.0, queue_end - t));
}
} // namespace detail

/// Seconds of plan `p`'s gradient all-reduce (its replicated parameters' gradients summed
/// across the devices, once a step) that its overlap with the backward leaves exposed: what a
/// pipeline stage spends once a step after its last micro-batch, not once a micro-batch.
[[nodiscard]] inline double exposed_gradient_sync(const plan& p, const cost_model& m) {
  double t = 0.0;
  for (const plan_step& s : p.steps)
    for (const transfer& tr : s.transfers)
      if (m.is_gradient_all_reduce(tr))
        t += m.comm_max(tr, p.ratios);
  return std::max(0.0, t - p.overlap_time);
}

/// What each device keeps for plan `p` (besides the FSDP copies of `gathered_parameter_peak`):
/// calls `f(tensor, placement, bytes, block)` for every output and transfer copy the memory
/// model counts (bytes: the same function of a device's shares on every device), with `block` the
/// recomputation block that holds it only while it runs
/// (`cost_model::none`: kept all step; a value of the data so kept counts
/// `cost_model::kept_copies` times). A device needs what is kept plus its largest block's.
template <class F>
void visit_memory(const plan& p, const cost_model& m, F&& f) {
  constexpr std::size_t none = cost_model::none;
  // An SFB layer's input is read after the backward: the version its product reads (the
  // tensor at that placement, made by its op or by a transfer) is kept.
  std::vector<std::pair<graph::node_id, placement>> sfb_input;
  if (p.recompute)
    for (const plan_step& s : p.steps)
      for (const transfer& t : s.transfers)
        if (t.sfb)
          sfb_input.emplace_back(m.graph()[s.node].inputs[0], s.rule.in[0]);
  const auto block_of = [&](graph::node_id t, placement at, std::size_t b) {
    return !p.recompute || b == none ||
                   std::ranges::find(sfb_input, std::pair{t, at}) != sfb_input.end()
               ? none
               : b;
  };
  // (a kept value of the data counts cost_model::kept_copies times)
  const auto visit = [&](graph::node_id t, placement at, linear_cost bytes, std::size_t block) {
    if (const double k = m.kept_copies(t); block == none && k != 1.0) {
      bytes.constant *= k;
      for (auto& term : bytes.terms)
        term.second *= k;
    }
    f(t, at, bytes, block);
  };
  for (const plan_step& s : p.steps) {
    for (const transfer& t : s.transfers)
      if (t.kind != transfer_kind::to_partial || t.tensor != s.node)
        visit(t.tensor, t.to, m.transfer_memory_of(t),
              block_of(t.tensor, t.to, m.recomputed_copy_block(t, s.node)));
    if (!detail::is_view(m, s.node))
      visit(s.node, s.rule.out, m.memory_of(s.node, s.rule.out),
            block_of(s.node, s.rule.out, m.recomputed_block(s.node)));
  }
}

/// As linear functions of a device's shares (the same on every device): what plan `p` keeps all
/// step, and what each recomputation block holds while it runs (see `visit_memory`; no FSDP
/// copies).
struct memory_terms {
  linear_cost kept;
  std::vector<std::optional<linear_cost>> blocks; ///< (none: a block with nothing recomputed)
};
/// (`kept_first`: a constant the kept terms start from.)
[[nodiscard]] inline memory_terms memory_terms_of(const plan& p, const cost_model& m,
                                                  double kept_first = 0.0) {
  memory_terms out;
  out.kept.constant = kept_first;
  const auto add = [](linear_cost& to, const linear_cost& c) {
    to.constant += c.constant;
    for (const auto& term : c.terms)
      to.terms.push_back(term);
  };
  visit_memory(p, m, [&](graph::node_id, placement, const linear_cost& c, std::size_t b) {
    if (b == cost_model::none) {
      add(out.kept, c);
      return;
    }
    if (b >= out.blocks.size())
      out.blocks.resize(b + 1);
    if (!out.blocks[b])
      out.blocks[b].emplace();
    add(*out.blocks[b], c);
  });
  return out;
}

/// Evaluates a program at `ratios`: fills each step's compute / comm / bottleneck and the
/// plan's totals (the overlap credit included) and per-device memory.
inline void evaluate(plan& p, const cost_model& m, const ratio_table& ratios) {
  p.ratios = ratios;
  p.compute_time = 0.0;
  p.comm_time = 0.0;
  p.device_compute.assign(m.devices(), 0.0);
  const auto add_compute = [&](const device_costs& dc) {
    for (std::size_t d = 0; d < dc.size(); ++d)
      p.device_compute[d] += value_at(dc[d], ratios, d);
  };
  for (plan_step& s : p.steps) {
    const auto [c, at] = m.add_compute(s.node, s.rule, ratios, p.device_compute);
    std::vector<device_costs> extra; // the transfers' compute (optimizer, SFB)
    for (const transfer& t : s.transfers) {
      extra.push_back(m.transfer_compute(t));
      add_compute(extra.back());
    }
    s.compute = c;
    s.bottleneck = at;
    s.comm = max_at(m.rule_comm(s.node, s.rule, ratios), ratios).first;
    for (std::size_t k = 0; k < s.transfers.size(); ++k) {
      s.comm += m.comm_max(s.transfers[k], ratios);
      s.compute += max_at(extra[k], ratios).first;
    }
    if (p.recompute) {
      const device_costs replay = m.replay_compute(s.node, s.rule);
      add_compute(replay);
      s.compute += max_at(replay, ratios).first;
      for (const transfer& t : s.transfers)
        s.comm += m.replay_share(t, s.node) * m.comm_max(t, ratios);
    }
    p.compute_time += s.compute;
    p.comm_time += s.comm;
  }
  p.overlap_time = m.overlap() * detail::hideable_gradient_time(p, m, ratios);
  p.step_time = p.compute_time + p.comm_time - p.overlap_time;
  const double gathered = gathered_parameter_peak(p.steps, m);
  const memory_terms mem = memory_terms_of(p, m);
  p.memory.assign(m.devices(), 0.0);
  for (std::size_t d = 0; d < m.devices(); ++d) {
    double block = 0.0;
    for (const auto& b : mem.blocks)
      if (b)
        block = std::max(block, value_at(*b, ratios, d));
    p.memory[d] = value_at(mem.kept, ratios, d) + block + gathered;
  }
}

/// A plan from a search result, evaluated at `ratios`.
[[nodiscard]] inline plan make_plan(const search_result& r, const cost_model& m,
                                    const ratio_table& ratios, std::string model,
                                    std::string strategy) {
  plan p;
  p.model = std::move(model);
  p.strategy = std::move(strategy);
  p.graph_hash = m.graph_hash_once([&] { return graph_hash(m.graph()); });
  p.graph_nodes = m.graph().size();
  p.recompute = r.recomputed;
  p.cluster_name = m.cluster().name;
  p.cluster_fingerprint = fingerprint(m.cluster());
  for (const auto& d : m.cluster().devices)
    p.device_names.push_back(d.name);
  p.segments = m.segments().policy();
  p.segment_names = m.segments().names();
  for (const step_choice& c : r.steps) {
    plan_step s;
    s.node = c.node;
    s.name = m.graph()[c.node].name;
    s.kind = m.graph()[c.node].kind;
    s.rule = c.rule;
    s.transfers = c.transfers;
    p.steps.push_back(std::move(s));
  }
  evaluate(p, m, ratios);
  return p;
}

/// The plan as JSON (the format is in docs/synthesis.md, "Plan files").
[[nodiscard]] inline nlohmann::json to_json(const plan& p, bool with_stats = true) {
  using nlohmann::json;
  json j;
  j["version"] = 1;
  j["model"] = p.model;
  j["strategy"] = p.strategy;
  j["graph"] = {{"nodes", p.graph_nodes}, {"hash", to_hex(p.graph_hash)}};
  j["cluster"] = {{"name", p.cluster_name},
                  {"fingerprint", to_hex(p.cluster_fingerprint)},
                  {"devices", p.device_names}};
  j["segments"] = {{"policy", p.segments == segment_policy::one ? "one" : "batch_and_model"},
                   {"names", p.segment_names}};
  j["ratios"] = p.ratios;
  if (p.recompute) // (absent when off: plans without it keep their hash)
    j["recompute"] = true;
  j["step_time"] = p.step_time;
  j["compute_time"] = p.compute_time;
  j["comm_time"] = p.comm_time;
  if (p.overlap_time != 0.0)
    j["overlap_time"] = p.overlap_time;
  j["memory"] = p.memory;
  j["device_compute"] = p.device_compute;
  j["binding"] = p.binding;
  json steps = json::array();
  for (const plan_step& s : p.steps) {
    json st;
    st["node"] = s.node;
    st["name"] = s.name;
    st["op"] = std::string(graph::name(s.kind));
    json in = json::array();
    for (placement q : s.rule.inputs())
      in.push_back(q.to_string());
    st["in"] = in;
    st["out"] = s.rule.out.to_string();
    st["family"] = detail::family_name(s.rule.kind);
    st["split_work"] = s.rule.split_work;
    st["bias_once"] = s.rule.bias_once;
    st["vocab_parallel"] = s.rule.vocab_parallel;
    json ts = json::array();
    for (const transfer& t : s.transfers) {
      json tj;
      tj["kind"] = std::string(name(t.kind));
      tj["tensor"] = t.tensor;
      tj["from"] = t.from.to_string();
      tj["to"] = t.to.to_string();
      tj["algorithm"] = std::string(name(t.algorithm));
      tj["sfb"] = t.sfb;
      ts.push_back(tj);
    }
    st["transfers"] = ts;
    st["compute"] = s.compute;
    st["comm"] = s.comm;
    st["bottleneck"] = s.bottleneck;
    steps.push_back(st);
  }
  j["steps"] = steps;
  if (with_stats)
    j["search"] = {{"expanded", p.stats.expanded},
                   {"generated", p.stats.generated},
                   {"rounds", p.stats.rounds},
                   {"search_seconds", p.stats.search_seconds},
                   {"lp_seconds", p.stats.lp_seconds},
                   {"gap", p.stats.gap},
                   {"optimal", p.stats.optimal},
                   {"fsdp_fallback", p.stats.fsdp_fallback},
                   {"judged", p.stats.judged},
                   {"judged_step", p.stats.judged_step},
                   {"reranked", p.stats.reranked},
                   {"model_pick_step", p.stats.model_pick_step},
                   {"model_pick_judged", p.stats.model_pick_judged}};
  return j;
}

inline std::uint64_t plan::hash() const {
  return fnv1a64(to_json(*this, false).dump());
}

/// Reads a plan written by `to_json` for graph `g`; throws `config_error` naming `source`, the
/// field and the fix (e.g. a plan made for another graph).
[[nodiscard]] inline plan plan_from_json(const nlohmann::json& j, const graph::graph& g,
                                         const std::string& source = "plan") {
  using hspmd::io::expect_array;
  using hspmd::io::expect_object;
  using hspmd::io::require_key;
  const hspmd::io::json_source src(source);
  expect_object(src, j, "", "an object");
  const auto str = [&](const nlohmann::json& o, std::string_view path, const char* key) {
    const auto& v = require_key(src, o, path, key, "a string");
    if (!v.is_string())
      src.fail(hspmd::io::json_child(path, key), "is " + hspmd::io::json_kind(v), "a string");
    return v.get<std::string>();
  };
  const auto num = [&](const nlohmann::json& o, std::string_view path, const char* key) {
    const auto& v = require_key(src, o, path, key, "a number");
    if (!v.is_number())
      src.fail(hspmd::io::json_child(path, key), "is " + hspmd::io::json_kind(v), "a number");
    return v.get<double>();
  };
  const auto strings = [&](const nlohmann::json& o, std::string_view path, const char* key) {
    std::vector<std::string> out;
    const std::string at = hspmd::io::json_child(path, key);
    for (const auto& v :
         expect_array(src, require_key(src, o, path, key, "an array"), at, "an array of strings")) {
      if (!v.is_string())
        src.fail(at, "has " + hspmd::io::json_kind(v), "an array of strings");
      out.push_back(v.get<std::string>());
    }
    return out;
  };
  const auto numbers = [&](const nlohmann::json& v, const std::string& at) {
    std::vector<double> out;
    for (const auto& x : expect_array(src, v, at, "an array of numbers")) {
      if (!x.is_number())
        src.fail(at, "has " + hspmd::io::json_kind(x), "an array of numbers");
      out.push_back(x.get<double>());
    }
    return out;
  };
  const auto flag = [&](const nlohmann::json& o, std::string_view path, const char* key) {
    const auto& v = require_key(src, o, path, key, "true or false");
    if (!v.is_boolean())
      src.fail(hspmd::io::json_child(path, key), "is " + hspmd::io::json_kind(v), "true or false");
    return v.get<bool>();
  };
  if (num(j, "", "version") != 1)
    src.fail("version", "unsupported version", "1");
  plan p;
  p.model = str(j, "", "model");
  p.strategy = str(j, "", "strategy");
  const auto& gj =
      expect_object(src, require_key(src, j, "", "graph", "an object"), "graph", "an object");
  p.graph_nodes = static_cast<std::size_t>(num(gj, "graph", "nodes"));
  p.graph_hash = std::stoull(str(gj, "graph", "hash"), nullptr, 16);
  if (p.graph_hash != graph_hash(g) || p.graph_nodes != g.size())
    src.fail("graph.hash",
             "the plan was made for another graph (" + to_hex(p.graph_hash) + ", this one is " +
                 to_hex(graph_hash(g)) + ")",
             "a plan synthesized for this model, batch and configuration");
  const auto& cj =
      expect_object(src, require_key(src, j, "", "cluster", "an object"), "cluster", "an object");
  p.cluster_name = str(cj, "cluster", "name");
  p.cluster_fingerprint = std::stoull(str(cj, "cluster", "fingerprint"), nullptr, 16);
  p.device_names = strings(cj, "cluster", "devices");
  const auto& sj =
      expect_object(src, require_key(src, j, "", "segments", "an object"), "segments", "an object");
  const std::string policy = str(sj, "segments", "policy");
  if (policy != "one" && policy != "batch_and_model")
    src.fail("segments.policy", "unknown policy \"" + policy + "\"", "one or batch_and_model");
  p.segments = policy == "one" ? segment_policy::one : segment_policy::batch_and_model;
  p.segment_names = strings(sj, "segments", "names");
  for (const auto& row : expect_array(src, require_key(src, j, "", "ratios", "an array"), "ratios",
                                      "an array of arrays"))
    p.ratios.push_back(numbers(row, "ratios"));
  if (p.ratios.size() != p.segment_names.size())
    src.fail("ratios", "has " + std::to_string(p.ratios.size()) + " segments",
             std::to_string(p.segment_names.size()) + " (one per segment)");
  for (const auto& row : p.ratios) {
    double sum = 0.0;
    for (double v : row) {
      if (!(v >= 0.0))
        src.fail("ratios", "has a negative or NaN share", "shares >= 0 summing to 1");
      sum += v;
    }
    if (row.size() != p.device_names.size() || std::abs(sum - 1.0) > 1e-6)
      src.fail("ratios", "a segment's shares do not cover the devices or do not sum to 1",
               std::to_string(p.device_names.size()) + " shares summing to 1");
  }
  if (j.contains("recompute"))
    p.recompute = flag(j, "", "recompute");
  p.step_time = num(j, "", "step_time");
  p.compute_time = num(j, "", "compute_time");
  p.comm_time = num(j, "", "comm_time");
  if (j.contains("overlap_time"))
    p.overlap_time = num(j, "", "overlap_time");
  p.memory = numbers(require_key(src, j, "", "memory", "an array"), "memory");
  p.device_compute =
      numbers(require_key(src, j, "", "device_compute", "an array"), "device_compute");
  p.binding = strings(j, "", "binding");
  const auto& steps =
      expect_array(src, require_key(src, j, "", "steps", "an array"), "steps", "an array");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::string path = hspmd::io::json_child("steps", i);
    const auto& st = expect_object(src, steps[i], path, "an object");
    plan_step s;
    const double node = num(st, path, "node");
    if (!(node >= 0.0) || node >= static_cast<double>(g.size()))
      src.fail(hspmd::io::json_child(path, "node"), "is not a node of the graph",
               "0 .. " + std::to_string(g.size() - 1));
    s.node = static_cast<graph::node_id>(node);
    s.name = str(st, path, "name");
    if (s.name != g[s.node].name)
      src.fail(hspmd::io::json_child(path, "name"),
               "\"" + s.name + "\" is not node " + std::to_string(s.node) + " (\"" +
                   g[s.node].name + "\")",
               "a plan for this graph");
    s.kind = g[s.node].kind;
    const auto in = strings(st, path, "in");
    s.rule.arity = in.size();
    if (in.size() > graph::max_operands || in.size() != g[s.node].inputs.size())
      src.fail(hspmd::io::json_child(path, "in"), "wrong number of placements",
               std::to_string(g[s.node].inputs.size()));
    for (std::size_t k = 0; k < in.size(); ++k)
      s.rule.in[k] = placement::parse(in[k], source + ": field " + path + ".in");
    s.rule.out = placement::parse(str(st, path, "out"), source + ": field " + path + ".out");
    const std::string fam = str(st, path, "family");
    bool known_family = false;
    for (auto f : {graph::rule::family::replicated, graph::rule::family::split,
                   graph::rule::family::linear, graph::rule::family::expert})
      if (detail::family_name(f) == fam) {
        s.rule.kind = f;
        known_family = true;
      }
    if (!known_family)
      src.fail(hspmd::io::json_child(path, "family"), "unknown \"" + fam + "\"",
               "replicated, split, linear or expert");
    s.rule.split_work = flag(st, path, "split_work");
    s.rule.bias_once = flag(st, path, "bias_once");
    s.rule.vocab_parallel = flag(st, path, "vocab_parallel");
    // The rule must be one the op has: a hand-edited plan cannot invent a placement.
    const auto rules = graph::rules_of(g, s.node);
    if (std::find(rules.begin(), rules.end(), s.rule) == rules.end())
      src.fail(path, "op " + std::string(graph::name(s.kind)) + " has no such rule",
               "placements one of the op's rules allows");
    const auto& ts = expect_array(src, require_key(src, st, path, "transfers", "an array"),
                                  path + ".transfers", "an array");
    for (std::size_t k = 0; k < ts.size(); ++k) {
      const std::string tp = hspmd::io::json_child(path + ".transfers", k);
      transfer t;
      const std::string kind = str(ts[k], tp, "kind");
      const auto tk = parse_transfer_kind(kind);
      if (!tk)
        src.fail(hspmd::io::json_child(tp, "kind"), "unknown \"" + kind + "\"",
                 "load, slice, all_gather, reduce_scatter, all_reduce, all_to_all or to_partial");
      t.kind = *tk;
      const double tensor = num(ts[k], tp, "tensor");
      if (!(tensor >= 0.0) || tensor >= static_cast<double>(g.size()))
        src.fail(hspmd::io::json_child(tp, "tensor"), "is not a node of the graph",
                 "0 .. " + std::to_string(g.size() - 1));
      t.tensor = static_cast<graph::node_id>(tensor);
      t.from = placement::parse(str(ts[k], tp, "from"), source + ": field " + tp + ".from");
      t.to = placement::parse(str(ts[k], tp, "to"), source + ": field " + tp + ".to");
      const std::string alg = str(ts[k], tp, "algorithm");
      const auto a = parse_uneven_algorithm(alg);
      if (!a)
        src.fail(hspmd::io::json_child(tp, "algorithm"), "unknown \"" + alg + "\"",
                 "padded, grouped or native");
      t.algorithm = *a;
      t.sfb = flag(ts[k], tp, "sfb");
      s.transfers.push_back(t);
    }
    s.compute = num(st, path, "compute");
    s.comm = num(st, path, "comm");
    s.bottleneck = static_cast<std::size_t>(num(st, path, "bottleneck"));
    p.steps.push_back(std::move(s));
  }
  if (const auto it = j.find("search"); it != j.end() && it->is_object()) {
    p.stats.expanded = it->value("expanded", std::size_t{0});
    p.stats.generated = it->value("generated", std::size_t{0});
    p.stats.rounds = it->value("rounds", std::size_t{0});
    p.stats.search_seconds = it->value("search_seconds", 0.0);
    p.stats.lp_seconds = it->value("lp_seconds", 0.0);
    p.stats.gap = it->value("gap", 0.0);
    p.stats.optimal = it->value("optimal", true);
    p.stats.fsdp_fallback = it->value("fsdp_fallback", false);
    p.stats.judged = it->value("judged", std::size_t{0});
    p.stats.judged_step = it->value("judged_step", 0.0);
    p.stats.reranked = it->value("reranked", false);
    p.stats.model_pick_step = it->value("model_pick_step", 0.0);
    p.stats.model_pick_judged = it->value("model_pick_judged", 0.0);
  }
  return p;
}

/// Reads plan file `file` (written by `to_json`, e.g. `hspmd-plan --json`) for graph `g`;
/// throws `config_error` naming the file, the field and the fix.
[[nodiscard]] inline plan load_plan(const std::filesystem::path& file, const graph::graph& g) {
  const std::string name = file.string();
  const auto text = io::read_text_file(file);
  return plan_from_json(
      io::parse_json_strict(text, io::json_source(name), "a plan written by hspmd"), g, name);
}

/// A time as people read it, with a unit at every magnitude: "0", "3.2 ns", "12.3 us",
/// "4.56 ms", "1.234 s", "2.5 min", "3.20 h", "4.1 days", "1.2e+23 years", "infinite".
[[nodiscard]] inline std::string seconds_text(double s) {
  if (std::isnan(s))
    return "undefined";
  if (s < 0.0)
    return "-" + seconds_text(-s);
  if (std::isinf(s))
    return "infinite";
  char b[48];
  constexpr double minute = 60.0;
  constexpr double hour = 3600.0;
  constexpr double day = 86400.0;
  constexpr double year = 365.25 * day;
  if (s == 0.0)
    std::snprintf(b, sizeof b, "0");
  else if (s < 1e-6)
    std::snprintf(b, sizeof b, "%.3g ns", s * 1e9);
  else if (s < 1e-3)
    std::snprintf(b, sizeof b, "%.1f us", s * 1e6);
  else if (s < 1.0)
    std::snprintf(b, sizeof b, "%.2f ms", s * 1e3);
  else if (s < minute)
    std::snprintf(b, sizeof b, "%.3f s", s);
  else if (s < hour)
    std::snprintf(b, sizeof b, "%.1f min", s / minute);
  else if (s < day)
    std::snprintf(b, sizeof b, "%.2f h", s / hour);
  else if (s < year)
    std::snprintf(b, sizeof b, "%.1f days", s / day);
  else
    std::snprintf(b, sizeof b, "%.3g years", s / year);
  return b;
}

/// A step time in milliseconds ("12.34 ms", as progress lines and scripts read them), or
/// `seconds_text` beyond 10^4 s or when not finite.
[[nodiscard]] inline std::string milliseconds_text(double s) {
  if (!std::isfinite(s) || std::abs(s) >= 1e4)
    return seconds_text(s);
  char b[48];
  std::snprintf(b, sizeof b, "%.2f ms", s * 1e3);
  return b;
}

namespace detail {

[[nodiscard]] inline std::string short_text(placement p) {
  return p.is_replicated() ? "R" : p.is_partial() ? "P" : "S" + std::to_string(p.dim());
}

[[nodiscard]] inline std::string transfer_text(const transfer& t, const graph::graph& g,
                                               const cost_model& m) {
  std::string s = std::string(name(t.kind));
  if (takes_algorithm(t.kind))
    s += "/" + std::string(name(t.algorithm));
  if (t.kind == transfer_kind::load)
    s += " " + short_text(t.to) + (t.sfb ? " (gradient by SFB)" : " (gradient all-reduce)");
  else
    s += " " + short_text(t.from) + "->" + short_text(t.to);
  s += " " + g[t.tensor].name;
  if (is_collective(t.kind) || t.kind == transfer_kind::load) // what moves (a load: its gradient)
    s += " " + bytes_text(m.bytes(t.tensor));
  return s;
}

} // namespace detail

/// The plan as a table: per step the op, placements in and out, collectives with algorithm
/// and bytes, compute and communication seconds and the bottleneck device; then per-device
/// ratios and memory, the LP's binding rows and the predicted step time.
[[nodiscard]] inline std::string explain(const plan& p, const cost_model& m) {
  const graph::graph& g = m.graph();
  std::ostringstream o;
  char line[512];
  o << "placements: R replicated, P partial, S<d> split along dimension d\n";
  if (p.recompute)
    o << "activations recomputed: the " << m.blocks().ranges.size()
      << " blocks' inner values are made again in the backward (their ops' forward priced "
         "twice), one block's held at a time\n";
  std::snprintf(line, sizeof line, "%-5s %-16s %-34s %-34s %-10s %-10s %s\n", "step", "op", "node",
                "placements in -> out", "compute", "comm", "bottleneck");
  o << line;
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const plan_step& s = p.steps[i];
    std::string pl;
    for (std::size_t k = 0; k < s.rule.arity; ++k)
      pl += (k == 0 ? "" : ",") + detail::short_text(s.rule.in[k]);
    pl += " -> " + detail::short_text(s.rule.out);
    if (s.rule.bias_once)
      pl += " (bias once)";
    if (s.rule.vocab_parallel)
      pl += " (vocabulary parallel)";
    std::snprintf(line, sizeof line, "%-5zu %-16s %-34.34s %-34.34s %-10s %-10s %s\n", i,
                  std::string(graph::name(s.kind)).c_str(), s.name.c_str(), pl.c_str(),
                  seconds_text(s.compute).c_str(), seconds_text(s.comm).c_str(),
                  s.bottleneck < p.device_names.size() ? p.device_names[s.bottleneck].c_str()
                                                       : "-");
    o << line;
    for (const transfer& t : s.transfers)
      if (t.kind != transfer_kind::load || t.sfb ||
          (m.is_parameter(t.tensor) && t.to.is_replicated() && m.devices() > 1))
        o << "      + " << detail::transfer_text(t, g, m) << "\n";
  }
  o << "\nper device (segment shares, compute seconds, predicted memory):\n";
  for (std::size_t d = 0; d < p.device_names.size(); ++d) {
    o << "  " << p.device_names[d] << ":";
    for (std::size_t s = 0; s < p.ratios.size(); ++s)
      o << " " << p.segment_names[s] << " " << detail::percent(p.ratios[s][d]);
    if (d < p.device_compute.size())
      o << ", compute " << seconds_text(p.device_compute[d]);
    o << ", memory " << detail::bytes_text(p.memory.at(d)) << " of "
      << detail::bytes_text(static_cast<double>(m.cluster().devices[d].memory)) << "\n";
  }
  if (!p.binding.empty()) {
    o << "binding (ratio LP):\n";
    for (const std::string& b : p.binding)
      o << "  " << b << "\n";
  }
  o << "predicted step time " << seconds_text(p.step_time) << " (compute "
    << seconds_text(p.compute_time) << ", communication " << seconds_text(p.comm_time);
  if (p.overlap_time > 0.0)
    o << ", of which " << seconds_text(p.overlap_time) << " hidden behind the backward";
  o << ")\n";
  return o.str();
}

} // namespace hspmd::synth
