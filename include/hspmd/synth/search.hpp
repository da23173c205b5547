#pragma once
// A* search for the distributed program, ratios fixed.
//
// Steps are the graph's computed nodes in graph order (a canonical topological order), one op
// per search step. A state is the step reached and, for every tensor still needed later, the set
// of placements it is available in (HAP's placement facts). A step picks one rule of its op;
// each operand the rule needs in a placement it does not have yet is loaded (inputs and
// parameters at first use) or converted by one communication instruction from a placement it
// has (all-gather, reduce-scatter, all-reduce, all-to-all, slice, to-partial; the uneven
// collectives once per algorithm), fused into the step. Per (tensor, placement) a fact is made
// at most once, so every op is computed once and a tensor is moved to each placement at most
// once. Among the ways to reach the same successor only the cheapest is kept, so the search
// branches over rules only; states with equal facts merge (hashed). A state also carries, per
// MoE layer between its dispatch and its combine, whether the dispatch routed tokens in parallel
// (per-rank capacity): the combine must route alike, which lowering checks (shards.hpp).
//
// Cost of a step: max over devices of its compute + the sum over its communication
// instructions of each one's max over devices (cost.hpp), forward and backward together.
// Heuristic: for every remaining op, the least it pays alone (compute, own communication, loads
// of parameters only it uses), plus a lower bound of the extra cost of rules and conversions
// that reaches the loss, shared among consumers (see build_heuristic) -- at most what any
// completion pays (admissible), so A* stops at an optimal program. It is not consistent (a step can
// pay less than the drop in the bound when a shared term is settled), so a state reached again more
// cheaply after it was expanded is reopened (`closed = false` below); dominance pruning keeps
// that rare. Goal: every op computed and the loss available `partial` (the sum loss).
// Budgets (expansions, seconds) end the search early with the best completion of the deepest
// open state and the gap to the A* lower bound.

#include <hspmd/synth/cost.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hspmd::synth {

/// Limits and restrictions of one search.
struct search_options {
  std::size_t max_expansions = 2'000'000; ///< states expanded before giving up on optimality
  double max_seconds = 20.0;              ///< wall time before giving up on optimality
  /// Which rules may run node `id` (baselines, pinned placements); all when empty.
  std::function<bool(graph::node_id, const graph::rule&)> allow_rule;
  /// Placements an input or parameter may be loaded in; all but partial when empty.
  std::function<bool(graph::node_id, placement)> allow_load;
  bool allow_sfb = true;        ///< SFB as an alternative to a weight-gradient all-reduce
  bool allow_all_to_all = true; ///< propose the opt-in kinds (transfer_traits::opt_in)
  std::vector<uneven_algorithm> algorithms = {uneven_algorithm::padded, uneven_algorithm::grouped,
                                              uneven_algorithm::native};
  /// FSDP-style parameters: each parameter a rule uses unsplit is kept split along its largest
  /// dimension (the value, its gradient and the optimizer state: a share of the bytes per
  /// device) and all-gathered before use (its gradient reduce-scattered back in the backward).
  /// `when_needed`: only when no plan fits in memory without it.
  enum class parameter_sharding : unsigned char {
    never,
    when_needed,
    always
  } shard_parameters = parameter_sharding::when_needed;
  bool check_memory = true; ///< prune states that exceed a device's memory
  /// Keep states with equal facts that trade cost for memory (exact under tight memory, but
  /// many more states). `search` retries with it when the fast search finds nothing that fits.
  bool memory_pareto = false;
  /// Whether `search` retries with `memory_pareto` when nothing fits (false: fail fast; the
  /// two-level planner's node searches, whose failures are covered by other node classes).
  bool pareto_retry = true;
  /// Activation recomputation over the model's blocks (cost_model::recomputed_block): a
  /// block's inner values are held only while it runs and computed again in the backward.
  /// `when_needed`: only when no plan fits in memory without it (parameters sharded or not).
  enum class recomputation : unsigned char {
    never,
    when_needed,
    always
  } recompute = recomputation::when_needed;
};

/// One step of a found program.
struct step_choice {
  graph::node_id node = 0;
  graph::rule rule;
  std::vector<transfer> transfers; ///< loads and conversions before the op, in operand order
  double compute = 0.0;            ///< seconds, max over devices (op + optimizer + SFB extra)
  double comm = 0.0;               ///< seconds, sum over instructions of max over devices
};

/// What the search found.
struct search_result {
  bool found = false;
  std::vector<step_choice> steps;
  double cost = 0.0;               ///< predicted seconds per training step at the search's ratios
  double lower_bound = 0.0;        ///< no program in the space costs less
  bool optimal = false;            ///< the search finished: cost == optimum
  bool sharded_parameters = false; ///< parameters kept split and gathered for use (FSDP)
  bool recomputed = false;         ///< activations recomputed over the model's blocks
  std::size_t expanded = 0;
  std::size_t generated = 0;
  double seconds = 0.0;
  std::string memory_message; ///< why no state fitted, when nothing was found
};

namespace detail {

using mask_t = std::uint16_t;

struct fact {
  graph::node_id tensor;
  mask_t mask;
  friend bool operator==(const fact&, const fact&) = default;
};

/// A state's memory, device independent: [0, 3) what is kept all step, [3, 6) the current
/// recomputation block's values, [6, 9) the largest finished block's (each a constant and a
/// coefficient per segment; blocks only under recomputation).
using memory_vector = std::array<double, 9>;

struct search_state {
  std::size_t step = 0;
  std::vector<fact> facts; ///< sorted by tensor
  double g = 0.0;
  memory_vector memory{};
  std::uint64_t moe = 0; ///< per open MoE layer (its slot's bit): dispatch ran token parallel
  std::size_t parent = std::numeric_limits<std::size_t>::max();
  std::size_t choice = 0;      ///< index into the choices of the search
  std::uint64_t signature = 0; ///< detail::signature of the facts
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::size_t next_alike = none; ///< the state before it with the same hash (searcher::index_)
  bool closed = false;
  bool dead = false; ///< dominated by another state of the same step
};

/// A live state as the dominance scans see it first (search_state's fields, packed).
struct peer {
  double g = 0.0;
  std::uint64_t signature = 0;
  std::uint64_t moe = 0;
  std::size_t id = 0;
};

/// Whether every tensor of `b` is available in `a` in at least `b`'s placements (the same
/// tensors, in order). Plain loops over the arrays: the search's inner loop.
[[nodiscard]] inline bool covers(const std::vector<fact>& a, const std::vector<fact>& b) {
  const std::size_t n = a.size();
  if (n != b.size())
    return false;
  const fact* const pa = a.data();
  const fact* const pb = b.data();
  for (std::size_t i = 0; i < n; ++i)
    if (pa[i].tensor != pb[i].tensor || (pa[i].mask & pb[i].mask) != pb[i].mask)
      return false;
  return true;
}

/// The facts' placements folded into 64 bits, each tensor's mask rotated by its own amount:
/// where covers(a, b) holds, signature(b) is a subset of signature(a), so a state whose bits
/// are not is passed over without walking its facts.
[[nodiscard]] inline std::uint64_t signature(const std::vector<fact>& f) {
  std::uint64_t s = 0;
  for (const fact& x : f)
    s |= std::rotl(static_cast<std::uint64_t>(x.mask), static_cast<int>((x.tensor * 13U) % 64U));
  return s;
}

/// `a` needs no more memory than `b` on any entry (relative slack 1e-12).
[[nodiscard]] inline bool memory_le(const memory_vector& a, const memory_vector& b) {
  const double* const pa = a.data();
  const double* const pb = b.data();
  for (std::size_t i = 0; i < std::tuple_size_v<memory_vector>; ++i)
    if (pa[i] > pb[i] * (1.0 + 1e-12))
      return false;
  return true;
}

[[nodiscard]] inline std::uint64_t hash_facts(std::size_t step, const std::vector<fact>& f,
                                              std::uint64_t moe = 0) {
  std::uint64_t h = (1469598103934665603ULL ^ step) + moe * 0x9e3779b97f4a7c15ULL;
  for (const fact& x : f) {
    h = (h ^ x.tensor) * 1099511628211ULL;
    h = (h ^ x.mask) * 1099511628211ULL;
  }
  return h;
}

/// Whether an MoE dispatch's or combine's rule `r` routes tokens in parallel (per-rank
/// capacity: the probabilities split). A layer's two steps must agree (lowering checks it in
/// shards.hpp, the search keeps it).
[[nodiscard]] inline bool moe_token_parallel(const graph::rule& r) {
  return r.kind == graph::rule::family::split && r.in[1].is_split();
}

/// The dispatch of MoE combine `combine` (the one routing the same probabilities), if any.
[[nodiscard]] inline std::optional<graph::node_id> moe_dispatch_of(const graph::graph& g,
                                                                   graph::node_id combine) {
  std::optional<graph::node_id> found;
  for (graph::node_id d = 0; d < g.size(); ++d)
    if (g[d].kind == graph::op::moe_dispatch && g[d].inputs[1] == g[combine].inputs[1])
      found = d;
  return found;
}

[[nodiscard]] inline mask_t bit(placement p) {
  return static_cast<mask_t>(mask_t{1} << code_of(p));
}

} // namespace detail

/// The searcher: precomputes per-node rules and costs at fixed ratios, then runs A*.
class searcher {
public:
  searcher(const cost_model& m, ratio_table ratios, search_options opt = {})
      : m_(&m), g_(&m.graph()), ratios_(std::move(ratios)), opt_(std::move(opt)), range_(ratios_) {
    prepare();
  }

  /// Runs A* from the empty state.
  [[nodiscard]] search_result run() {
    const auto start = std::chrono::steady_clock::now();
    search_result res;
    states_.clear();
    choices_.clear();
    index_.clear();
    by_step_.assign(order_.size() + 2, {});
    prune_ = true;
    // Some device cannot hold every tensor even at its smallest placement: no state fits, and
    // expanding them would only spend the budget finding that out.
    if (opt_.check_memory)
      for (std::size_t d = 0; d < floor_.size(); ++d)
        if (floor_[d] > capacity_[d]) {
          res.memory_message = memory_failure();
          res.seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          return res;
        }
    detail::search_state s0;
    states_.push_back(s0);
    index_[detail::hash_facts(0, {})] = 0;
    using entry = std::tuple<double, std::size_t, std::size_t>; // f, -step (as max - step), id
    std::priority_queue<entry, std::vector<entry>, std::greater<>> open;
    const std::size_t big = order_.size() + 1;
    open.emplace(h_[0], big, 0);
    std::optional<std::size_t> goal;
    bool budget_hit = false;
    while (!open.empty()) {
      const auto [f, depth_key, id] = open.top();
      open.pop();
      (void)depth_key;
      if (states_[id].closed || states_[id].dead ||
          f > states_[id].g + h_[states_[id].step] + 1e-15 * std::max(1.0, f))
        continue; // stale entry
      if (states_[id].step == order_.size()) {
        goal = id;
        break;
      }
      if (res.expanded >= opt_.max_expansions ||
          (res.expanded % 256 == 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
               opt_.max_seconds)) {
        budget_hit = true;
        open.emplace(f, depth_key, id); // still open: counts for the lower bound
        break;
      }
      states_[id].closed = true;
      ++res.expanded;
      expand(id, [&](std::size_t child) {
        ++res.generated;
        const auto& c = states_[child];
        open.emplace(c.g + h_[c.step], big - c.step, child);
      });
    }
    if (goal) {
      res.found = true;
      res.optimal = true;
      res.cost = states_[*goal].g;
      res.lower_bound = res.cost;
      res.steps = unwind(*goal);
    } else if (budget_hit) {
      // Lower bound: the smallest f still open. Program: greedy completion of the deepest.
      double lb = std::numeric_limits<double>::infinity();
      std::size_t deepest = 0;
      bool any = false;
      while (!open.empty()) {
        const auto [f, depth_key, id] = open.top();
        open.pop();
        if (states_[id].closed || states_[id].dead)
          continue;
        lb = std::min(lb, f);
        const auto& s = states_[id];
        if (!any || s.step > states_[deepest].step ||
            (s.step == states_[deepest].step &&
             s.g + h_[s.step] < states_[deepest].g + h_[states_[deepest].step]))
          deepest = id;
        any = true;
      }
      if (any) {
        // (the cheaper of two completions: the cheapest successor at every step, and the
        // blocks' programs repeated)
        std::optional<std::size_t> done = greedy(deepest);
        if (const auto again = repeated_completion(deepest);
            again && (!done || states_[*again].g < states_[*done].g))
          done = again;
        if (done) {
          res.found = true;
          res.cost = states_[*done].g;
          res.lower_bound = std::min(lb, res.cost);
          res.steps = unwind(*done);
        }
      }
    }
    if (!res.found)
      res.memory_message = memory_failure();
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return res;
  }

  /// Debug: the states generated at step k (facts as "tensor:mask" and g).
  [[nodiscard]] std::vector<std::pair<double, std::string>> states_at(std::size_t k) const {
    std::vector<std::pair<double, std::string>> out;
    for (const auto& st : states_)
      if (st.step == k) {
        std::string f;
        for (const auto& x : st.facts)
          f += (*g_)[x.tensor].name + ":" + std::to_string(x.mask) + " ";
        out.emplace_back(st.g, f + (st.closed ? "[closed]" : ""));
      }
    std::sort(out.begin(), out.end());
    return out;
  }
  /// The heuristic at step k (exposed for tests of admissibility).
  [[nodiscard]] double heuristic(std::size_t k) const { return h_.at(k); }
  /// The computed nodes in search order.
  [[nodiscard]] const std::vector<graph::node_id>& order() const noexcept { return order_; }

  /// Cost of the cheapest completion from the state reached by applying `prefix` rule indices
  /// (one per step, into `rules(step)`), by exhaustive enumeration of every remaining rule
  /// sequence. For tests on tiny graphs only: exponential.
  [[nodiscard]] std::optional<double> exhaustive(const std::vector<std::size_t>& prefix = {}) {
    states_.clear();
    choices_.clear();
    index_.clear();
    by_step_.assign(order_.size() + 2, {});
    prune_ = false;
    states_.push_back({});
    std::size_t at = 0;
    for (std::size_t r : prefix) {
      std::optional<std::size_t> next;
      expand_rule(at, r, [&](std::size_t child) { next = child; });
      if (!next)
        return std::nullopt;
      at = *next;
    }
    return enumerate(at) - states_[at].g;
  }
  /// Rules allowed at search step k.
  [[nodiscard]] const std::vector<graph::rule>& rules(std::size_t k) const { return rules_.at(k); }

private:
  struct choice {
    std::size_t rule = 0;
    std::vector<transfer> transfers;
    double compute = 0.0;
    double comm = 0.0;
  };

  void prepare() {
    // The conversion kinds (and uneven algorithms) from each placement code to each.
    for (std::size_t a = 0; a < placement_codes; ++a)
      for (std::size_t b = 0; b < placement_codes; ++b) {
        const placement q = placement_of_code(a), p = placement_of_code(b);
        std::vector<transfer>& ways = ways_[a][b];
        for (std::size_t k = 0; k < transfer_kind_count; ++k) {
          const auto kind = static_cast<transfer_kind>(k);
          const transfer_facts f = facts(kind);
          if (!f.converts(q, p) || (f.opt_in && !opt_.allow_all_to_all))
            continue;
          if (f.algorithm)
            for (uneven_algorithm alg : opt_.algorithms)
              ways.push_back({kind, 0, q, p, alg});
          else
            ways.push_back({kind, 0, q, p});
        }
      }
    const std::size_t n = g_->size();
    const auto loss = g_->loss();
    if (!loss)
      throw plan_error("synthesis", "the graph has no loss", "trace the model with set_loss");
    for (graph::node_id i = 0; i < n; ++i)
      if ((*g_)[i].kind != graph::op::input && (*g_)[i].kind != graph::op::parameter)
        order_.push_back(i);
    step_of_.assign(n, std::numeric_limits<std::size_t>::max());
    for (std::size_t k = 0; k < order_.size(); ++k)
      step_of_[order_[k]] = k;
    recompute_ = opt_.recompute == search_options::recomputation::always && m_->has_blocks();
    block_at_.clear();
    for (graph::node_id id : order_)
      block_at_.push_back(m_->blocks().block_of[id]);
    last_use_.assign(n, 0);
    uses_.assign(n, 0);
    for (std::size_t k = 0; k < order_.size(); ++k)
      for (graph::node_id t : (*g_)[order_[k]].inputs) {
        last_use_[t] = std::max(last_use_[t], k);
        ++uses_[t];
      }
    last_use_[*loss] = std::numeric_limits<std::size_t>::max();
    // Rules, their compute, and the heuristic.
    rules_.resize(order_.size());
    rule_cost_.resize(order_.size());
    h_.assign(order_.size() + 1, 0.0);
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const graph::node_id id = order_[k];
      const auto& pin = (*g_)[id].pin; // a placement the model fixed in its types
      for (const graph::rule& r : graph::rules_of(*g_, id))
        if ((!pin || r.out == *pin) && (!opt_.allow_rule || opt_.allow_rule(id, r)) &&
            !(unpaired_combine(id) && token_parallel(r)))
          rules_[k].push_back(r);
      // (under recomputation a recomputed op's forward runs twice)
      const double replay = recompute_ && m_->recomputed_block(id) != cost_model::none
                                ? m_->forward_fraction(id)
                                : 0.0;
      for (const graph::rule& r : rules_[k])
        rule_cost_[k].emplace_back(m_->compute_max(id, r, ratios_) * (1.0 + replay),
                                   max_at(m_->rule_comm(id, r, ratios_), ratios_).first);
      if (rules_[k].empty())
        throw plan_error("synthesis: node \"" + (*g_)[id].name + "\"",
                         pin ? "no rule of this op yields its pinned placement " +
                                   pin->to_string() + " within the allowed rules"
                             : std::string("no rule is allowed for this op"),
                         "pin a placement the op can produce, or allow more rules");
    }
    pair_moe_layers();
    build_heuristic();
    // Each step of a block whose block before it has the same ops (kinds, shapes and rules,
    // in order): that block's step at its position (repeated_completion).
    same_before_.assign(order_.size(), none_step);
    {
      std::map<std::size_t, std::vector<std::size_t>> steps_of; // block -> its steps
      for (std::size_t k = 0; k < order_.size(); ++k)
        if (block_at_[k] != graph::block_layout::none)
          steps_of[block_at_[k]].push_back(k);
      const std::vector<std::size_t>* before = nullptr;
      for (const auto& [block, steps] : steps_of) {
        if (before != nullptr && before->size() == steps.size()) {
          bool alike = true;
          for (std::size_t i = 0; i < steps.size() && alike; ++i) {
            const graph::node& a = (*g_)[order_[(*before)[i]]];
            const graph::node& b = (*g_)[order_[steps[i]]];
            alike = a.kind == b.kind && a.out.dims == b.out.dims &&
                    rules_[(*before)[i]] == rules_[steps[i]];
          }
          if (alike)
            for (std::size_t i = 0; i < steps.size(); ++i)
              same_before_[steps[i]] = (*before)[i];
        }
        before = &steps;
      }
    }
    capacity_.clear();
    // Sharded parameters are gathered for use into one shared buffer (not counted per copy):
    // room for the two largest at once is kept free (a weight and its bias, or a tied weight's
    // two uses); a plan's exact peak is counted when it is evaluated.
    reserve_ = 0.0;
    if (opt_.shard_parameters == search_options::parameter_sharding::always) {
      std::array<double, 2> largest{};
      for (graph::node_id t : g_->parameters()) {
        const double b = m_->working_copy_bytes(t);
        if (b > largest[0])
          largest = {b, largest[0]};
        else if (b > largest[1])
          largest[1] = b;
      }
      reserve_ = largest[0] + largest[1];
    }
    for (const auto& d : m_->cluster().devices)
      capacity_.push_back(static_cast<double>(d.memory));
    // Devices with the same memory and shares fit alike: each such class is checked once, at
    // its first device (a cluster has a few kinds, not a thousand).
    fit_classes_.clear();
    {
      std::map<std::array<double, 3>, std::size_t> seen;
      for (std::size_t d = 0; d < capacity_.size(); ++d) {
        std::array<double, 3> key{capacity_[d], 0.0, 0.0};
        for (std::size_t s = 0; s < ratios_.size() && s < 2; ++s)
          key[1 + s] = ratios_[s][d];
        if (seen.emplace(key, d).second)
          fit_classes_.push_back({capacity_[d], {key[1], key[2]}, d});
      }
    }
    // A lower bound of any plan's memory per device: every op output and every input or
    // parameter at its smallest placement on that device (under recomputation, a block's
    // values only for the largest block).
    floor_.assign(capacity_.size(), reserve_);
    std::vector<std::vector<double>> block_floor(recompute_ ? m_->blocks().ranges.size() : 0);
    // (Each placement's costs are built once for all devices: built once per device, this was
    // quadratic in the devices, 80 % of synthesis time at 256.)
    std::vector<double> best(floor_.size());
    const auto smallest = [&](const std::vector<placement>& options, graph::node_id t,
                              bool output) {
      std::fill(best.begin(), best.end(), std::numeric_limits<double>::infinity());
      for (placement p : options) {
        const linear_cost c = output ? m_->output_memory_of(t, p) : m_->memory_of(t, p);
        for (std::size_t d = 0; d < floor_.size(); ++d)
          best[d] = std::min(best[d], value_at(c, ratios_, d));
      }
      const std::size_t b = output && recompute_ ? m_->recomputed_block(t) : cost_model::none;
      std::vector<double>& to = b == cost_model::none ? floor_ : block_floor[b];
      to.resize(floor_.size(), 0.0);
      const double copies = b == cost_model::none ? m_->kept_copies(t) : 1.0;
      for (std::size_t d = 0; d < floor_.size(); ++d)
        if (std::isfinite(best[d]))
          to[d] += copies * best[d];
    };
    for (std::size_t k = 0; k < order_.size(); ++k) {
      std::vector<placement> outs;
      for (const graph::rule& r : rules_[k])
        outs.push_back(r.out);
      smallest(outs, order_[k], true);
    }
    for (graph::node_id t = 0; t < n; ++t) {
      if (((*g_)[t].kind != graph::op::input && (*g_)[t].kind != graph::op::parameter) ||
          uses_[t] == 0) // (one no op reads is never loaded)
        continue;
      std::vector<placement> loads;
      for (std::size_t c = 0; c < 2 + (*g_)[t].out.rank(); ++c)
        if (load_allowed(t, placement_of_code(c)))
          loads.push_back(placement_of_code(c));
      smallest(loads, t, false);
    }
    for (std::size_t d = 0; d < floor_.size(); ++d) {
      double most = 0.0;
      for (const auto& b : block_floor)
        most = b.empty() ? most : std::max(most, b[d]);
      floor_[d] += most;
    }
    pareto_ = opt_.check_memory && opt_.memory_pareto;
  }

  // An MoE layer's dispatch and combine route tokens alike (per-rank capacity) or neither does:
  // lowering refuses a plan that mixes them (shards.hpp). Where a combine token parallel has no
  // dispatch, its token-parallel rules are no choice.
  [[nodiscard]] static bool token_parallel(const graph::rule& r) {
    return detail::moe_token_parallel(r);
  }
  [[nodiscard]] bool unpaired_combine(graph::node_id id) const {
    return (*g_)[id].kind == graph::op::moe_combine && !detail::moe_dispatch_of(*g_, id);
  }
  // Each MoE layer open at a step (its dispatch done, its combine not) holds a bit of the state
  // (`search_state::moe`): layers open at once get different bits.
  void pair_moe_layers() {
    moe_slot_.assign(order_.size(), -1);
    std::vector<std::pair<std::size_t, std::size_t>> layers; // (dispatch step, combine step)
    for (std::size_t k = 0; k < order_.size(); ++k)
      if ((*g_)[order_[k]].kind == graph::op::moe_combine)
        if (const auto d = detail::moe_dispatch_of(*g_, order_[k]); d && step_of_[*d] < k)
          layers.emplace_back(step_of_[*d], k);
    std::sort(layers.begin(), layers.end());
    std::array<std::size_t, 64> free_from{}; // per bit: the step after its last layer's combine
    for (const auto& [d, c] : layers)
      for (std::size_t b = 0; b < free_from.size(); ++b)
        if (free_from[b] <= d) {
          free_from[b] = c + 1;
          moe_slot_[d] = moe_slot_[c] = static_cast<int>(b);
          break;
        } // (more than 64 layers open at once: unpaired here, lowering still checks)
  }

  // Why nothing fitted: the devices whose floor exceeds their memory (one line, grouped by kind
  // and memory, each group with its count, first and last device and the largest need), or the
  // closest miss.
  [[nodiscard]] std::string memory_failure() const {
    const auto& devs = m_->cluster().devices;
    std::vector<std::size_t> short_of;
    for (std::size_t d = 0; d < floor_.size(); ++d)
      if (floor_[d] > capacity_[d])
        short_of.push_back(d);
    if (short_of.empty())
      return memory_message_;
    if (short_of.size() == 1) {
      const std::size_t d = short_of[0];
      return "device " + devs[d].name + " (rank " + std::to_string(d) + ") needs at least " +
             detail::bytes_text(floor_[d]) + " (every tensor at its smallest placement) but has " +
             detail::bytes_text(capacity_[d]);
    }
    struct group {
      std::string kind;
      double capacity;
      std::size_t count = 0, first = 0, last = 0;
      double need = 0.0;
    };
    std::vector<group> groups;
    for (std::size_t d : short_of) {
      auto it = std::find_if(groups.begin(), groups.end(), [&](const group& x) {
        return x.kind == devs[d].kind && x.capacity == capacity_[d];
      });
      if (it == groups.end()) {
        groups.push_back({devs[d].kind, capacity_[d], 0, d, d, 0.0});
        it = groups.end() - 1;
      }
      ++it->count;
      it->last = d;
      it->need = std::max(it->need, floor_[d]);
    }
    std::string text = std::to_string(short_of.size()) + " of " + std::to_string(devs.size()) +
                       " devices cannot hold every tensor even at its smallest placement:";
    for (std::size_t k = 0; k < groups.size(); ++k) {
      const group& x = groups[k];
      text += std::string(k == 0 ? " " : "; ") + std::to_string(x.count) + " x " +
              (x.kind.empty() ? "device" : x.kind) + " (" + devs[x.first].name +
              (x.count > 1 ? " ... " + devs[x.last].name : std::string()) + ", rank " +
              std::to_string(x.first) + (x.count > 1 ? "-" + std::to_string(x.last) : "") +
              ") need up to " + detail::bytes_text(x.need) + " but have " +
              detail::bytes_text(x.capacity);
    }
    return text;
  }

  // What step k pays under rule r whatever the state: compute, the rule's own communication,
  // and the loads of parameters it alone uses.
  [[nodiscard]] double unavoidable(std::size_t k, const graph::rule& r) const {
    const graph::node_id id = order_[k];
    double c =
        m_->compute_max(id, r, ratios_) + max_at(m_->rule_comm(id, r, ratios_), ratios_).first;
    (void)k;
    const graph::node& n = (*g_)[id];
    for (std::size_t i = 0; i < r.arity; ++i) {
      const graph::node_id t = n.inputs[i];
      if (m_->is_parameter(t) && uses_[t] == 1) {
        double best = std::numeric_limits<double>::infinity();
        for (const auto& seq : loads(k, r, i))
          best = std::min(best, price(seq));
        c += best; // infinite: this rule cannot load the parameter it alone uses
      }
    }
    return c;
  }

  // Cheapest way, over one or more conversions, from placement code a to code b of tensor t.
  [[nodiscard]] std::vector<double> conversion_distances(graph::node_id t) const {
    const std::size_t codes = 2 + (*g_)[t].out.rank();
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> d(codes * codes, inf);
    for (std::size_t a = 0; a < codes; ++a) {
      d[a * codes + a] = 0.0;
      for (std::size_t b = 0; b < codes; ++b) {
        if (a == b)
          continue;
        for (const transfer& tr :
             conversions(t, static_cast<detail::mask_t>(1U << a), placement_of_code(b)))
          d[a * codes + b] = std::min(d[a * codes + b], price(tr));
      }
    }
    for (std::size_t via = 0; via < codes; ++via)
      for (std::size_t a = 0; a < codes; ++a)
        for (std::size_t b = 0; b < codes; ++b)
          d[a * codes + b] = std::min(d[a * codes + b], d[a * codes + via] + d[via * codes + b]);
    return d;
  }

  // The heuristic h(k) = sum over remaining ops j of base(j) + N_k(loss, partial), where
  //   base(j)   = min over j's rules of what j alone pays (compute, own communication, loads of
  //               parameters only j uses), and
  //   N_k(t, p) = a lower bound of what it costs, beyond every op's base, to have tensor t in
  //               placement p, counting only ops at step >= k:
  //               min over the producer's rules r of [ (r's cost - base) +
  //                   sum over r's operands u of N_k(u, r's placement of u) / uses(u) ] +
  //               the cheapest conversions from r's output placement to p;
  //               0 for tensors made before step k (a state there may have paid already).
  // Each op's extra cost and each conversion reaches the loss split over its consumers (shares
  // of 1 / uses), so the total charged is at most what any program pays: admissible. It sees
  // that a tensor-parallel layer needs a replicated input (an all-gather, or replicated work
  // upstream) where a data-parallel one pays its weight-gradient all-reduce. N_k is computed at
  // checkpoints c and used for every k <= c (fewer ops counted: still a lower bound).
  void build_heuristic() {
    const std::size_t steps = order_.size();
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> base(steps);
    std::vector<double> base_min(steps, inf);
    for (std::size_t k = 0; k < steps; ++k)
      for (const graph::rule& r : rules_[k]) {
        base[k].push_back(unavoidable(k, r));
        base_min[k] = std::min(base_min[k], base[k].back());
      }
    std::vector<std::size_t> first_use(g_->size(), std::numeric_limits<std::size_t>::max());
    for (std::size_t k = steps; k-- > 0;)
      for (graph::node_id t : (*g_)[order_[k]].inputs)
        first_use[t] = k;
    const graph::node_id loss = *g_->loss();
    std::vector<std::vector<double>> dist(g_->size());
    for (graph::node_id t = 0; t < g_->size(); ++t)
      if ((uses_[t] > 0 || t == loss) && !m_->is_parameter(t))
        dist[t] = conversion_distances(t);
    const auto extra_at = [&](std::size_t c) {
      std::vector<std::array<double, placement_codes>> n(g_->size());
      for (graph::node_id t = 0; t < g_->size(); ++t) {
        n[t].fill(0.0);
        if (dist[t].empty())
          continue;
        const std::size_t codes = 2 + (*g_)[t].out.rank();
        const auto kind = (*g_)[t].kind;
        if (kind == graph::op::input) {
          if (first_use[t] < c)
            continue;
          std::array<double, placement_codes> best;
          best.fill(inf);
          for (std::size_t q = 0; q < codes; ++q)
            if (load_allowed(t, placement_of_code(q)))
              for (std::size_t p = 0; p < codes; ++p)
                best[p] = std::min(best[p], dist[t][q * codes + p]);
          for (std::size_t p = 0; p < codes; ++p)
            n[t][p] = std::isfinite(best[p]) ? best[p] : 0.0;
          continue;
        }
        const std::size_t k = step_of_[t];
        if (k >= steps || k < c)
          continue;
        std::array<double, placement_codes> best;
        best.fill(inf);
        const graph::node& nd = (*g_)[t];
        for (std::size_t r = 0; r < rules_[k].size(); ++r) {
          if (!std::isfinite(base[k][r]))
            continue;
          double v = base[k][r] - base_min[k];
          for (std::size_t i = 0; i < rules_[k][r].arity; ++i) {
            const graph::node_id u = nd.inputs[i];
            if (uses_[u] > 0)
              v += n[u][code_of(rules_[k][r].in[i])] / static_cast<double>(uses_[u]);
          }
          const std::size_t from = code_of(rules_[k][r].out);
          for (std::size_t p = 0; p < codes; ++p)
            best[p] = std::min(best[p], v + dist[t][from * codes + p]);
        }
        for (std::size_t p = 0; p < codes; ++p)
          n[t][p] = std::isfinite(best[p]) ? best[p] : 0.0;
      }
      return n[loss][code_of(partial{})];
    };
    std::vector<double> h(steps + 1, 0.0);
    const std::size_t stride =
        std::max<std::size_t>(1, static_cast<std::size_t>(std::sqrt(static_cast<double>(steps))));
    double checkpoint_value = 0.0; // extra_at of the nearest checkpoint at or after k
    double base_suffix = 0.0;
    for (std::size_t k = steps; k-- > 0;) {
      base_suffix += base_min[k];
      if (k % stride == 0 || k + 1 == steps)
        checkpoint_value = extra_at(k);
      h[k] = base_suffix + checkpoint_value;
    }
    h_ = std::move(h);
  }

  // (communication, compute) seconds of a transfer at the search's ratios, memoized.
  [[nodiscard]] std::pair<double, double> priced(const transfer& t) const {
    const std::uint64_t key =
        (std::uint64_t{t.tensor} << 20U) |
        (std::uint64_t{static_cast<std::uint8_t>(t.kind)} << 16U) |
        (std::uint64_t{code_of(t.from)} << 12U) | (std::uint64_t{code_of(t.to)} << 8U) |
        (std::uint64_t{static_cast<std::uint8_t>(t.algorithm)} << 4U) | (t.sfb ? 1U : 0U);
    if (const auto it = prices_.find(key); it != prices_.end())
      return it->second;
    const std::pair<double, double> v{m_->comm_max(t, ratios_, range_),
                                      max_at(m_->transfer_compute(t), ratios_).first};
    prices_.emplace(key, v);
    return v;
  }
  [[nodiscard]] double price(const transfer& t) const {
    const auto [comm, compute] = priced(t);
    return comm + compute;
  }

  [[nodiscard]] bool load_allowed(graph::node_id t, placement p) const {
    if (p.is_partial())
      return false;
    if (const auto& pin = (*g_)[t].pin; pin && !(*pin == p))
      return false; // pinned input or parameter
    return !opt_.allow_load || opt_.allow_load(t, p);
  }

  [[nodiscard]] std::vector<transfer> load_options(std::size_t k, const graph::rule& r,
                                                   std::size_t operand) const {
    const graph::node& n = (*g_)[order_[k]];
    const graph::node_id t = n.inputs[operand];
    const placement p = r.in[operand];
    std::vector<transfer> out;
    if (!load_allowed(t, p))
      return out;
    out.push_back({transfer_kind::load, t, p, p, uneven_algorithm::native, false});
    // SFB: a data-parallel matmul/linear (input rows split, weight replicated).
    if (opt_.allow_sfb && m_->is_parameter(t) && operand == 1 && p.is_replicated() &&
        r.in[0].is_split() && r.in[0].dim() + 1 < (*g_)[n.inputs[0]].out.rank() &&
        m_->sfb_possible(t) && m_->devices() > 1)
      out.push_back({transfer_kind::load, t, p, p, uneven_algorithm::native, true});
    return out;
  }

  // The ways to bring input or parameter `operand` of rule r at step k to the rule's placement:
  // one load, or (sharded parameters) a load split along the parameter's largest loadable
  // dimension followed by a conversion to the rule's placement.
  [[nodiscard]] std::vector<std::vector<transfer>> loads(std::size_t k, const graph::rule& r,
                                                         std::size_t operand) const {
    const graph::node_id t = (*g_)[order_[k]].inputs[operand];
    const placement p = r.in[operand];
    std::vector<std::vector<transfer>> out;
    if (opt_.shard_parameters == search_options::parameter_sharding::always &&
        m_->is_parameter(t) && !p.is_split() && m_->devices() > 1) {
      const auto& dims = (*g_)[t].out.dims;
      std::optional<std::size_t> best;
      for (std::size_t d = 0; d < dims.size(); ++d)
        if (dims[d] > 1 && load_allowed(t, placement::split_along(d)) &&
            (!best || dims[d] > dims[*best]))
          best = d;
      if (best) {
        const placement at = placement::split_along(*best);
        const transfer load{transfer_kind::load, t, at, at, uneven_algorithm::native, false};
        for (const transfer& c : conversions(t, detail::bit(at), p))
          out.push_back({load, c});
        if (!out.empty())
          return out;
      }
    }
    for (const transfer& tr : load_options(k, r, operand))
      out.push_back({tr});
    return out;
  }
  [[nodiscard]] double price(const std::vector<transfer>& seq) const {
    double c = 0.0;
    for (const transfer& tr : seq)
      c += price(tr);
    return c;
  }

  // Conversions of tensor t from any placement in `mask` to `p`: per source placement, the kind
  // that converts it (transfer_traits::converts), once per uneven algorithm where one applies.
  [[nodiscard]] std::vector<transfer> conversions(graph::node_id t, detail::mask_t mask,
                                                  placement p) const {
    std::vector<transfer> out;
    conversions_into(out, t, mask, p);
    return out;
  }
  // The same into `out` (cleared first): the search's inner loop keeps one buffer.
  void conversions_into(std::vector<transfer>& out, graph::node_id t, detail::mask_t mask,
                        placement p) const {
    out.clear();
    const std::size_t to = code_of(p);
    for (std::size_t c = 0; c < placement_codes; ++c) {
      if (((static_cast<unsigned>(mask) >> c) & 1U) == 0)
        continue;
      for (transfer tr : ways_[c][to]) {
        tr.tensor = t;
        out.push_back(tr);
      }
    }
  }

  template <class Emit>
  void expand(std::size_t id, Emit&& emit) {
    for (std::size_t r = 0; r < rules_[states_[id].step].size(); ++r)
      expand_rule(id, r, emit);
  }

  // Applies rule r at the state's step; emits the successor (new or improved) if it fits.
  template <class Emit>
  void expand_rule(std::size_t id, std::size_t ri, Emit&& emit) {
    const std::size_t k = states_[id].step;
    const graph::node_id nid = order_[k];
    const graph::node& n = (*g_)[nid];
    const graph::rule& r = rules_[k][ri];
    std::uint64_t moe = states_[id].moe;
    if (moe_slot_[k] >= 0) {
      const std::uint64_t b = std::uint64_t{1} << moe_slot_[k];
      if (n.kind == graph::op::moe_dispatch) {
        if (token_parallel(r))
          moe |= b;
      } else {
        if (token_parallel(r) != ((moe & b) != 0))
          return; // routed unlike its dispatch
        moe &= ~b;
      }
    }
    std::vector<detail::fact> facts = states_[id].facts;
    choice ch;
    ch.rule = ri;
    ch.compute = rule_cost_[k][ri].first;
    ch.comm = rule_cost_[k][ri].second;
    detail::memory_vector mem = states_[id].memory;
    if (recompute_ && k > 0 && block_at_[k] != block_at_[k - 1]) { // a block ended
      for (std::size_t i = 3; i < 6; ++i) {
        mem[i + 3] = std::max(mem[i + 3], mem[i]);
        mem[i] = 0.0;
      }
    }
    // A loaded parameter keeps its value, gradient and optimizer state; a converted copy of it
    // is a working copy like any activation. `block`: held only while the block runs.
    const auto add_memory = [&](graph::node_id t, placement p, bool loaded, bool block) {
      const double b = m_->bytes(t) * (loaded && m_->is_parameter(t) ? parameter_copies : 1.0) *
                       (block ? 1.0 : m_->kept_copies(t));
      const std::size_t at = block ? 3 : 0;
      if (p.is_split())
        mem[at + 1 + m_->segments().of(t, p.dim())] += b;
      else
        mem[at] += b;
    };
    const auto find = [&](graph::node_id t) -> detail::fact* {
      const auto it =
          std::lower_bound(facts.begin(), facts.end(), t,
                           [](const detail::fact& f, graph::node_id v) { return f.tensor < v; });
      return it != facts.end() && it->tensor == t ? &*it : nullptr;
    };
    for (std::size_t i = 0; i < r.arity; ++i) {
      const graph::node_id t = n.inputs[i];
      const placement p = r.in[i];
      detail::fact* f = find(t);
      if (f != nullptr && (f->mask & detail::bit(p)) != 0)
        continue;
      // The cheapest way to have it: a load sequence, or one conversion (the first when none
      // is finite: priced infinite).
      std::span<const transfer> best;
      double best_cost = std::numeric_limits<double>::infinity();
      std::vector<std::vector<transfer>> options;
      if (f == nullptr) {
        const auto kind = (*g_)[t].kind;
        if (kind != graph::op::input && kind != graph::op::parameter)
          return; // a computed tensor no longer live: cannot happen in graph order
        options = loads(k, r, i);
        for (const auto& seq : options)
          if (const double c = price(seq); best.empty() || c < best_cost) {
            best_cost = c;
            best = seq;
          }
      } else {
        conversions_into(converted_, t, f->mask, p);
        for (const transfer& tr : converted_)
          if (const double c = price(tr); best.empty() || c < best_cost) {
            best_cost = c;
            best = std::span<const transfer>(&tr, 1);
          }
      }
      if (best.empty())
        return;
      detail::mask_t held = 0;
      for (const transfer& tr : best) {
        ch.transfers.push_back(tr);
        const auto [comm, compute] = priced(tr);
        ch.comm += comm;
        ch.compute += compute;
        if (recompute_)
          ch.comm += comm * m_->replay_share(tr, nid);
        // A gathered copy is in the reserve where the search keeps one (sharded parameters);
        // elsewhere it is counted whole, as if kept.
        if (!(reserve_ > 0.0 && m_->is_gathered_parameter(tr)))
          add_memory(t, tr.to, tr.kind == transfer_kind::load,
                     recompute_ && m_->recomputed_copy_block(tr, nid) != cost_model::none);
        // SFB reads its layer's input after the backward: kept (counted twice if it was a
        // block's value: an over-estimate)
        if (recompute_ && tr.sfb && m_->recomputed_block(n.inputs[0]) != cost_model::none)
          add_memory(n.inputs[0], r.in[0], false, false);
        held = static_cast<detail::mask_t>(held | detail::bit(tr.to));
      }
      if (f == nullptr) {
        const detail::fact nf{t, held};
        facts.insert(
            std::lower_bound(facts.begin(), facts.end(), t,
                             [](const detail::fact& x, graph::node_id v) { return x.tensor < v; }),
            nf);
      } else {
        f->mask = static_cast<detail::mask_t>(f->mask | held);
      }
    }
    // The output (a view's is its input's); the loss becomes partial (free from replicated).
    if (!m_->is_view(nid))
      add_memory(nid, r.out, false, recompute_ && m_->recomputed_block(nid) != cost_model::none);
    detail::mask_t out_mask = detail::bit(r.out);
    if (g_->loss() == nid && !r.out.is_partial()) {
      ch.transfers.push_back({transfer_kind::to_partial, nid, r.out, partial{}});
      out_mask = static_cast<detail::mask_t>(out_mask | detail::bit(partial{}));
    }
    facts.insert(
        std::lower_bound(facts.begin(), facts.end(), nid,
                         [](const detail::fact& x, graph::node_id v) { return x.tensor < v; }),
        detail::fact{nid, out_mask});
    // Drop what no later step reads.
    std::erase_if(facts, [&](const detail::fact& x) { return last_use_[x.tensor] <= k; });
    if (opt_.check_memory && !fits(mem))
      return;
    const double g = states_[id].g + ch.compute + ch.comm;
    const std::uint64_t h = detail::hash_facts(k + 1, facts, moe);
    // (the states of one hash chained through next_alike: no list to allocate per state)
    std::size_t& head = index_.try_emplace(h, detail::search_state::none).first->second;
    for (std::size_t other = head; other != detail::search_state::none;
         other = states_[other].next_alike) {
      auto& o = states_[other];
      if (o.step != k + 1 || o.facts != facts || o.moe != moe)
        continue;
      // When memory is tight, a costlier state that needs less memory is kept too (Pareto).
      const bool cheaper = g < o.g - 1e-15 * std::max(1.0, g);
      if (!cheaper && (!pareto_ || detail::memory_le(o.memory, mem)))
        return; // dominated
      if (cheaper && !o.dead && (!pareto_ || detail::memory_le(mem, o.memory))) {
        o.closed = false; // reopened: A* with an inconsistent (but admissible) heuristic
        o.g = g;
        for (detail::peer& e : by_step_[k + 1])
          if (e.id == other)
            e.g = g;
        o.memory = mem;
        o.parent = id;
        o.choice = choices_.size();
        choices_.push_back(std::move(ch));
        emit(other);
        return;
      }
    }
    // Dominance: a state at the same step whose every tensor is available in at least the
    // same placements, for no more cost (and, when memory is exact, no more memory), reaches
    // everything this one reaches at no more cost.
    // These two scans are the search's inner loop (every state against every other of its
    // step): written over plain arrays, so that an unoptimized (Debug) build plans quickly too.
    auto& same_step = by_step_[k + 1];
    const std::uint64_t sig = detail::signature(facts);
    if (prune_) {
      // (the peers' cost and signature side by side: most are passed over on those alone)
      const detail::peer* const ps = same_step.data();
      const std::size_t count = same_step.size();
      for (std::size_t i = 0; i < count; ++i) {
        const detail::peer& e = ps[i];
        if (e.g <= g && (sig & ~e.signature) == 0 && e.moe == moe &&
            (!pareto_ || detail::memory_le(states_[e.id].memory, mem)) &&
            detail::covers(states_[e.id].facts, facts))
          return;
      }
      bool killed = false;
      for (std::size_t i = 0; i < count; ++i) {
        const detail::peer& e = ps[i];
        if (g <= e.g && (e.signature & ~sig) == 0 && e.moe == moe) {
          detail::search_state& o = states_[e.id];
          if (!o.dead && (!pareto_ || detail::memory_le(mem, o.memory)) &&
              detail::covers(facts, o.facts)) {
            o.dead = true; // dominated: never expanded (again)
            killed = true;
          }
        }
      }
      if (killed)
        std::erase_if(same_step, [&](const detail::peer& e) { return states_[e.id].dead; });
    }
    detail::search_state s;
    s.step = k + 1;
    s.facts = std::move(facts);
    s.signature = sig;
    s.moe = moe;
    s.g = g;
    s.memory = mem;
    s.parent = id;
    s.choice = choices_.size();
    s.next_alike = head;
    choices_.push_back(std::move(ch));
    states_.push_back(std::move(s));
    head = states_.size() - 1;
    if (prune_)
      same_step.push_back({g, sig, moe, states_.size() - 1});
    emit(states_.size() - 1);
  }

  [[nodiscard]] bool fits(const detail::memory_vector& mem) {
    for (const fit_class& fc : fit_classes_) {
      const std::size_t d = fc.device;
      std::array<double, 3> part{}; // kept (with the reserve), current block, largest finished
      for (std::size_t i = 0; i < 3; ++i)
        part[i] = (mem[3 * i] + (i == 0 ? reserve_ : 0.0)) + mem[3 * i + 1] * fc.share[0] +
                  mem[3 * i + 2] * fc.share[1];
      const double need = part[0] + std::max(part[1], part[2]);
      if (need > capacity_[d]) {
        const double over = need - capacity_[d];
        if (over < least_over_) {
          least_over_ = over;
          memory_message_ = "no combination of placements fits: the closest the search got "
                            "needs " +
                            detail::bytes_text(need) + " on device " +
                            m_->cluster().devices[d].name + " (rank " + std::to_string(d) +
                            "), which has " + detail::bytes_text(capacity_[d]) + ": " +
                            detail::bytes_text(over) + " too much";
        }
        return false;
      }
    }
    return true;
  }

  // Completes from `id` choosing the cheapest successor at every step; returns the goal state.
  [[nodiscard]] std::optional<std::size_t> greedy(std::size_t id) {
    while (states_[id].step < order_.size()) {
      index_.clear(); // no merging: every successor is a new state
      prune_ = false;
      std::optional<std::size_t> best;
      for (std::size_t r = 0; r < rules_[states_[id].step].size(); ++r)
        expand_rule(id, r, [&](std::size_t child) {
          if (!best || states_[child].g < states_[*best].g)
            best = child;
        });
      if (!best)
        return std::nullopt; // nothing fits
      id = *best;
    }
    return id;
  }

  // Completes from `id` taking at each step of a block the rule that the same step of the
  // block before took (a budget-cut search over a model of repeated blocks has searched the
  // first blocks well: their programs stand for the rest), where it applies and fits; the
  // cheapest successor elsewhere. Returns the goal state.
  [[nodiscard]] std::optional<std::size_t> repeated_completion(std::size_t id) {
    std::vector<std::size_t> taken(order_.size(), none_step); // rule index per step on the path
    for (std::size_t s = id; states_[s].parent != std::numeric_limits<std::size_t>::max();
         s = states_[s].parent)
      taken[states_[states_[s].parent].step] = choices_[states_[s].choice].rule;
    while (states_[id].step < order_.size()) {
      const std::size_t k = states_[id].step;
      index_.clear(); // no merging: every successor is a new state
      prune_ = false;
      std::optional<std::size_t> next;
      if (const std::size_t j = same_before_[k]; j != none_step && taken[j] != none_step)
        expand_rule(id, taken[j], [&](std::size_t child) { next = child; });
      if (!next) // (as greedy)
        for (std::size_t r = 0; r < rules_[k].size(); ++r)
          expand_rule(id, r, [&](std::size_t child) {
            if (!next || states_[child].g < states_[*next].g)
              next = child;
          });
      if (!next)
        return std::nullopt; // nothing fits
      taken[k] = choices_[states_[*next].choice].rule;
      id = *next;
    }
    return id;
  }

  [[nodiscard]] double enumerate(std::size_t id) {
    if (states_[id].step == order_.size())
      return states_[id].g;
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < rules_[states_[id].step].size(); ++r) {
      // Fresh state per branch: no merging, so every rule sequence is visited.
      std::optional<std::size_t> child;
      const std::size_t before = states_.size();
      index_.clear();
      expand_rule(id, r, [&](std::size_t c) { child = c; });
      if (child && *child >= before)
        best = std::min(best, enumerate(*child));
    }
    return best;
  }

  [[nodiscard]] std::vector<step_choice> unwind(std::size_t id) const {
    std::vector<step_choice> out;
    while (states_[id].parent != std::numeric_limits<std::size_t>::max()) {
      const auto& s = states_[id];
      const choice& c = choices_[s.choice];
      const std::size_t k = states_[s.parent].step;
      out.push_back({order_[k], rules_[k][c.rule], c.transfers, c.compute, c.comm});
      id = s.parent;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }

  const cost_model* m_;
  const graph::graph* g_;
  ratio_table ratios_;
  search_options opt_;
  std::vector<graph::node_id> order_;
  std::vector<std::size_t> step_of_;
  std::vector<std::size_t> last_use_;
  std::vector<std::size_t> uses_;
  std::vector<std::vector<graph::rule>> rules_;
  std::vector<std::vector<std::pair<double, double>>> rule_cost_; ///< (compute, comm) per rule
  mutable std::unordered_map<std::uint64_t, std::pair<double, double>> prices_;
  std::vector<double> h_;
  std::vector<double> capacity_;
  share_range range_; // of ratios_
  struct fit_class {
    double capacity;
    std::array<double, 2> share; ///< per segment (0 where there is no second)
    std::size_t device;          ///< its first device
  };
  std::vector<fit_class> fit_classes_;
  double reserve_ = 0.0;              // room for gathered parameter copies (sharded searches)
  bool recompute_ = false;            // activations recomputed over the model's blocks
  std::vector<std::size_t> block_at_; // per step: the block its node lies in
  std::vector<int> moe_slot_;         // per step: its MoE layer's state bit (-1: none)
  std::vector<double> floor_;         ///< per device: no plan needs less memory
  bool pareto_ = false;               ///< keep states that trade cost for memory
  std::vector<detail::search_state> states_;
  std::vector<choice> choices_;
  std::unordered_map<std::uint64_t, std::size_t> index_; ///< per hash: its last state
  std::vector<std::vector<detail::peer>> by_step_;       ///< live states per step, for dominance
  std::vector<transfer> converted_;                      ///< expand_rule's conversions (a buffer)
  static constexpr std::size_t none_step = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> same_before_; ///< per step: the previous alike block's step
  /// Per source and target placement code: the conversions that apply (tensor 0).
  std::array<std::array<std::vector<transfer>, placement_codes>, placement_codes> ways_;
  bool prune_ = true; ///< false while enumerating exhaustively
  double least_over_ = std::numeric_limits<double>::infinity();
  std::string memory_message_;
};

/// Runs A* on `m` at `ratios`. States with equal facts merge keeping the cheaper; when that
/// finds nothing within memory, the search runs again keeping the smaller too. Where the options
/// say `when_needed`, it then shards parameters (FSDP), and then recomputes activations (with
/// parameters whole, then sharded), each only if nothing fits without it.
[[nodiscard]] inline search_result search(const cost_model& m, const ratio_table& ratios,
                                          const search_options& opt = {}) {
  using sharding = search_options::parameter_sharding;
  const auto once = [&](const search_options& o) {
    searcher s(m, ratios, o);
    search_result r = s.run();
    r.sharded_parameters = o.shard_parameters == sharding::always;
    r.recomputed = o.recompute == search_options::recomputation::always && m.has_blocks();
    if (r.found || !o.check_memory || o.memory_pareto || !o.pareto_retry ||
        r.memory_message.empty())
      return r;
    search_options careful = o;
    careful.memory_pareto = true;
    searcher again(m, ratios, careful);
    search_result r2 = again.run();
    r2.sharded_parameters = r.sharded_parameters;
    r2.recomputed = r.recomputed;
    r2.expanded += r.expanded;
    r2.generated += r.generated;
    r2.seconds += r.seconds;
    return r2;
  };
  const auto merge = [](search_result later, const search_result& before) {
    later.expanded += before.expanded;
    later.generated += before.generated;
    later.seconds += before.seconds;
    if (!later.found && later.memory_message.empty())
      later.memory_message = before.memory_message;
    return later;
  };
  // Parameters whole, then (nothing fits) sharded and gathered for use (FSDP).
  const auto sharded_if_needed = [&](const search_options& o) {
    search_result r = once(o);
    if (r.found || o.shard_parameters != sharding::when_needed || !o.check_memory ||
        r.memory_message.empty())
      return r;
    search_options sharded = o;
    sharded.shard_parameters = sharding::always;
    return merge(once(sharded), r);
  };
  using recomputation = search_options::recomputation;
  search_options first = opt;
  if (opt.recompute == recomputation::when_needed)
    first.recompute = recomputation::never;
  search_result r = sharded_if_needed(first);
  if (r.found || opt.recompute != recomputation::when_needed || !opt.check_memory ||
      r.memory_message.empty() || !m.has_blocks())
    return r;
  // Still nothing fits: recompute the blocks' activations instead of keeping them.
  search_options again = opt;
  again.recompute = recomputation::always;
  return merge(sharded_if_needed(again), r);
}

} // namespace hspmd::synth
