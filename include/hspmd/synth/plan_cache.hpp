#pragma once
// A cache of synthesized plans on disk, so that a job started again skips synthesis.
//
// One JSON file per *shape*: the traced graph, the model name, the synthesis options and the
// cluster's shape (device names, kinds and nodes, whether it has links between nodes), hashed.
// The file holds the plan, the cluster fingerprint it was made for (every number of the cluster
// file, canonical JSON) and the ratio LP's final basis. A lookup then has three outcomes:
//   hit      same shape and the same cluster numbers: the stored plan, no synthesis;
//   resolved same shape, other numbers (speeds, bandwidths, latencies, memory, slowdowns,
//            collective costs): the stored program re-priced on the new cluster and its ratio
//            LP re-solved from the stored basis (milliseconds); the file is updated;
//   miss     no file (or one that no longer reads): synthesis, and the plan is stored.
// A re-solve keeps the stored program skeleton: with very different numbers a fresh synthesis
// could find a better one (delete the file, or give no cache, to synthesize again).
// Calibrated runs (a measured compute profile) are not cached: their prices change every run.
// The key does not see `search_options::allow_rule` / `allow_load` (functions): a program that
// sets them gives the cache a directory of its own.
// Files are written to a temporary name and renamed, so a reader never sees half a file.

#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/lp/simplex.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/ratio_lp.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <system_error>

namespace hspmd::synth {

/// What a cached synthesis did.
enum class cache_outcome : std::uint8_t {
  uncached, ///< no cache, or a calibrated run: synthesized
  miss,     ///< synthesized and stored
  hit,      ///< the stored plan, unchanged
  resolved  ///< the stored program with its ratios re-solved for the cluster's new numbers
};
[[nodiscard]] constexpr std::string_view name(cache_outcome o) noexcept {
  switch (o) {
  case cache_outcome::miss:
    return "miss";
  case cache_outcome::hit:
    return "hit";
  case cache_outcome::resolved:
    return "resolved";
  case cache_outcome::uncached:
    break;
  }
  return "uncached";
}

/// A plan and how it was obtained.
struct cached_plan {
  plan p;
  cache_outcome outcome = cache_outcome::uncached;
  std::filesystem::path file;    ///< the cache entry (empty when uncached)
  double seconds = 0.0;          ///< time to obtain the plan (lookup, re-solve or synthesis)
  std::size_t lp_iterations = 0; ///< resolved: simplex iterations from the stored basis
  bool warm = false;             ///< resolved: the stored basis was used
};

namespace detail {

// The cluster without its numbers: what a plan's program depends on besides prices.
[[nodiscard]] inline std::string cluster_shape(const cluster& c) {
  std::string s = "devices:";
  for (const device_spec& d : c.devices)
    s += d.name + "/" + d.kind + "/" + std::to_string(d.node) + ";";
  s += c.inter_node ? "inter" : "intra";
  return s;
}

[[nodiscard]] inline std::string options_text(const synth_options& o) {
  std::ostringstream s;
  s << "segments " << static_cast<int>(o.segments) << " rounds " << o.max_rounds << " lp "
    << o.solve_lp << " gemm " << static_cast<int>(o.gemm_type) << " sfb " << o.search.allow_sfb
    << " a2a " << o.search.allow_all_to_all << " expansions " << o.search.max_expansions
    << " seconds " << o.search.max_seconds << " memory " << o.search.check_memory << " pareto "
    << o.search.memory_pareto << " algorithms";
  for (auto a : o.search.algorithms)
    s << " " << static_cast<int>(a);
  // (only where not the default: keys of plans cached before these options stay the same)
  if (o.search.shard_parameters != search_options::parameter_sharding::when_needed)
    s << " sharding " << static_cast<int>(o.search.shard_parameters);
  if (o.search.recompute != search_options::recomputation::when_needed)
    s << " recompute " << static_cast<int>(o.search.recompute);
  if (o.judge) // (the judge itself is not named: one judge, the simulator, is wired)
    s << " judged " << o.judge_margin;
  return s.str();
}

[[nodiscard]] inline nlohmann::json basis_to_json(const lp::basis& b) {
  nlohmann::json v = nlohmann::json::array();
  nlohmann::json r = nlohmann::json::array();
  for (auto s : b.variables)
    v.push_back(static_cast<int>(s));
  for (auto s : b.rows)
    r.push_back(static_cast<int>(s));
  return {{"variables", v}, {"rows", r}};
}

[[nodiscard]] inline lp::basis basis_from_json(const nlohmann::json& j) {
  lp::basis b;
  for (const auto& s : j.at("variables"))
    b.variables.push_back(static_cast<lp::basis_status>(s.get<int>()));
  for (const auto& s : j.at("rows"))
    b.rows.push_back(static_cast<lp::basis_status>(s.get<int>()));
  return b;
}

inline void write_atomically(const std::filesystem::path& file, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  const auto tmp = file.string() + ".tmp" + std::to_string(std::random_device{}());
  {
    std::ofstream f(tmp);
    f << text << "\n";
    if (!f)
      throw config_error("plan cache " + file.parent_path().string(), "cannot be written",
                         "give a writable directory for the plan cache");
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec)
    throw config_error("plan cache " + file.string(), "cannot be replaced: " + ec.message(),
                       "give a writable directory for the plan cache");
}

} // namespace detail

/// The key of a plan's shape (see the file comment).
[[nodiscard]] inline std::uint64_t plan_shape_key(const graph::graph& g, const cluster& c,
                                                  const synth_options& o,
                                                  const std::string& model) {
  return fnv1a64(to_hex(graph_hash(g)) + "|" + model + "|" + detail::options_text(o) + "|" +
                 detail::cluster_shape(c));
}

/// A plan's program with its ratios re-solved for other numbers of the same cluster shape.
struct resolved_plan {
  plan p;                     ///< the program, new ratios, predictions at them
  lp::basis basis;            ///< the LP's final basis (the next re-solve's warm start)
  std::size_t iterations = 0; ///< simplex iterations
  bool warm = false;          ///< started from the given basis
};

/// Re-solves the ratio LP of `p`'s program for cluster `c` (priced by `m`, built for `c`),
/// from `warm` where given; the plan is re-evaluated at the new ratios and names `c`. Nothing
/// when the LP is not optimal. Deterministic: ranks that call it with the same inputs agree.
[[nodiscard]] inline std::optional<resolved_plan>
resolve_ratios(plan p, const cost_model& m, const cluster& c, const lp::basis* warm = nullptr) {
  const ratio_problem q = ratio_problem_of(p, m, p.ratios);
  ratio_solution sol = solve_ratios(q, {}, warm);
  if (sol.status != lp::status::optimal)
    return std::nullopt;
  p.cluster_name = c.name;
  p.cluster_fingerprint = fingerprint(c);
  p.device_names.clear();
  for (const device_spec& d : c.devices)
    p.device_names.push_back(d.name);
  evaluate(p, m, sol.ratios);
  p.binding.clear();
  for (const auto& b : sol.bottlenecks)
    if (p.binding.size() < 6)
      p.binding.push_back(b.text);
  return resolved_plan{std::move(p), std::move(sol.basis), sol.iterations, warm != nullptr};
}

/// Synthesizes a plan for `g` on `c` through the cache in `dir` (empty: no cache); see the
/// file comment. Deterministic for given cache contents: call it on one rank and share the
/// plan, since ranks may see different caches.
[[nodiscard]] inline cached_plan synthesize_cached(const graph::graph& g, const cluster& c,
                                                   const synth_options& opt,
                                                   const std::string& model,
                                                   const std::filesystem::path& dir) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const auto since = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  cached_plan out;
  if (dir.empty() || opt.profile) {
    out.p = synthesize(g, c, opt, model);
    out.seconds = since();
    return out;
  }
  const std::uint64_t shape = plan_shape_key(g, c, opt, model);
  const std::uint64_t numbers = fingerprint(c);
  out.file = dir / ("plan-" + to_hex(shape) + ".json");
  const cost_model m(g, c, segment_map(g, opt.segments), opt.profile, opt.gemm_type);
  const auto store = [&](const plan& p, const lp::basis& b) {
    const nlohmann::json entry{{"shape", to_hex(shape)},
                               {"cluster_fingerprint", to_hex(numbers)},
                               {"plan", to_json(p)},
                               {"basis", detail::basis_to_json(b)}};
    detail::write_atomically(out.file, entry.dump(1));
  };
  // A stored entry of this shape, if it reads (a stale or foreign file is a miss).
  std::optional<nlohmann::json> entry;
  if (std::ifstream f(out.file); f) {
    try {
      nlohmann::json j = nlohmann::json::parse(f);
      if (j.at("shape").get<std::string>() == to_hex(shape))
        entry = std::move(j);
    } catch (const std::exception&) {
      entry.reset();
    }
  }
  if (entry) {
    try {
      plan p = plan_from_json(entry->at("plan"), g, out.file.string());
      if (entry->at("cluster_fingerprint").get<std::string>() == to_hex(numbers)) {
        out.p = std::move(p);
        out.outcome = cache_outcome::hit;
        out.seconds = since();
        return out;
      }
      const lp::basis warm = detail::basis_from_json(entry->at("basis"));
      if (auto r = resolve_ratios(std::move(p), m, c, warm.variables.empty() ? nullptr : &warm)) {
        out.warm = r->warm;
        out.lp_iterations = r->iterations;
        out.p = std::move(r->p);
        out.outcome = cache_outcome::resolved;
        out.seconds = since();
        store(out.p, r->basis);
        return out;
      }
    } catch (const error&) { // a plan that no longer fits this graph or cluster: synthesize
    } catch (const nlohmann::json::exception&) {
    }
  }
  out.p = synthesize(g, c, opt, model);
  out.outcome = cache_outcome::miss;
  out.seconds = since();
  // The final basis of the plan's ratio LP, for the next re-solve.
  lp::basis b;
  if (c.size() > 1 && opt.solve_lp) {
    const ratio_solution sol = solve_ratios(ratio_problem_of(out.p, m, out.p.ratios));
    if (sol.status == lp::status::optimal)
      b = sol.basis;
  }
  store(out.p, b);
  return out;
}

} // namespace hspmd::synth
