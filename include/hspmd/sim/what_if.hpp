#pragma once
// What if the cluster changed? Changes a cluster as a user says it ("add 2 x a100", "remove node
// 3", "remove gpu7", "slow gpu7 x2": cluster/changes.hpp), plans the model again on the changed
// cluster, and says what that does to the plan, the step time (the cost model's and the
// simulator's), the shares and the bottleneck (the ratio LP's binding rows). Where the change keeps
// the cluster's shape (a device slower or faster), the old program is also re-balanced alone — its
// ratio LP re-solved from the old basis, as the trainer's --rebalance does — so the answer shows
// what re-planning buys over re-balancing.
//
//     const cluster changed = sim::apply_all(c, {"slow gpu7 x2"});
//     sim::what_if_answer a = sim::what_if(g, c, changed, opt, "bert", plan);
//
// Bad changes throw config_error naming the change and what would be accepted.

#include <hspmd/cluster/changes.hpp>
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/plan_cache.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::sim {

using hspmd::apply;
using hspmd::apply_all;
using hspmd::cluster_change;
using hspmd::parse_change;

/// What a change does.
struct what_if_answer {
  cluster changed;
  synth::plan before;                    ///< the plan on the old cluster
  synth::plan after;                     ///< synthesized on the changed cluster
  std::optional<synth::plan> rebalanced; ///< the old program, ratios re-solved (same shape)
  result simulated_before, simulated_after;
  double seconds = 0.0; ///< to answer (planning and simulating the changed cluster)
};

/// Plans `g` again on `changed` (`c` changed: `apply_all`); `before` is the plan on `c`.
[[nodiscard]] inline what_if_answer what_if(const graph::graph& g, const cluster& c,
                                            const cluster& changed, const synth::synth_options& opt,
                                            const std::string& model, const synth::plan& before) {
  const auto t0 = std::chrono::steady_clock::now();
  what_if_answer a{changed, before, {}, std::nullopt, {}, {}, 0.0};
  const synth::segment_map segments(g, opt.segments);
  const synth::cost_model m_before(g, c, segments, opt.profile, opt.gemm_type);
  const synth::cost_model m_after(g, a.changed, segments, opt.profile, opt.gemm_type);
  a.after = synth::synthesize(g, a.changed, opt, model);
  if (a.changed.size() == c.size()) {
    if (auto r = synth::resolve_ratios(before, m_after, a.changed))
      a.rebalanced = std::move(r->p);
  }
  a.simulated_before = simulate(before, m_before);
  a.simulated_after = simulate(a.after, m_after);
  a.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return a;
}

} // namespace hspmd::sim
