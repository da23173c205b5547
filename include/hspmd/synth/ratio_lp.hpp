#pragma once
// The sharding-ratio LP: given a program (which steps run, what each costs per device as a
// function of the device's share of a segment), find the shares that minimize the step time.
//
// Model. Segment s (e.g. the batch) is split among devices by ratios r[s][d] >= 0 with
// sum_d r[s][d] = 1. Step k costs device d
//     compute[k][d] = constant + sum over its terms coefficient * r[segment][d]     (seconds)
//     comm[k][d]    = likewise                                                      (seconds)
// and a step takes  max_d compute[k][d] + max_d comm[k][d]  (the slowest device computes, then
// the slowest link communicates). The step time is the sum over steps. Device d needs
//     memory[d] = constant + sum of coefficient * r[segment][d]   <=   capacity[d]    (bytes).
//
// Full form: one max-variable per step and kind, one row per step, kind and device
// (~2 * steps * devices rows, few columns: the LP solver goes through the dual).
// Collapsed form: when every step depends on a single segment and, per segment, the coefficients
// factor as f_k * g_d with device-independent constants (costs proportional to work / speed), the
// sum of maxima is (sum_k f_k) * max_d g_d r_d, so one max-variable per segment and kind is
// enough, and devices with identical coefficients and memory form one class with one ratio.
// Worked example: 2 devices, device 0 twice as fast, one segment, compute 4 r0 and 8 r1 per step:
// max(4 r0, 8 r1) is smallest at r0 = 2/3, r1 = 1/3 (both 8/3).

#include <hspmd/core/error.hpp>
#include <hspmd/lp/problem.hpp>
#include <hspmd/lp/simplex.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::synth {

/// A linear function of one device's ratios: constant + sum of coefficient * r[segment][device].
/// (segment, coefficient) pairs. Plans have at most two segments, so two are held inline and
/// only more go to the heap: the cost model builds one cost per device for every instruction it
/// prices, and at thousands of devices a heap block per cost made the allocator most of the
/// synthesis time.
class term_list {
public:
  using value_type = std::pair<std::size_t, double>;
  term_list() = default;
  term_list(std::initializer_list<value_type> l) {
    for (const value_type& v : l)
      push_back(v);
  }
  void push_back(const value_type& v) {
    if (heap_.empty() && size_ < inline_.size()) {
      inline_[size_++] = v;
      return;
    }
    if (heap_.empty())
      heap_.assign(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(size_));
    heap_.push_back(v);
    size_ = heap_.size();
  }
  void emplace_back(std::size_t segment, double coefficient) { push_back({segment, coefficient}); }
  [[nodiscard]] value_type* begin() noexcept {
    return heap_.empty() ? inline_.data() : heap_.data();
  }
  [[nodiscard]] value_type* end() noexcept { return begin() + size_; }
  [[nodiscard]] const value_type* begin() const noexcept {
    return heap_.empty() ? inline_.data() : heap_.data();
  }
  [[nodiscard]] const value_type* end() const noexcept { return begin() + size_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  value_type& operator[](std::size_t i) noexcept { return begin()[i]; }
  const value_type& operator[](std::size_t i) const noexcept { return begin()[i]; }
  friend bool operator==(const term_list& a, const term_list& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

private:
  std::array<value_type, 2> inline_{};
  std::vector<value_type> heap_; // all of them, once there are more than fit inline
  std::size_t size_ = 0;
};

struct linear_cost {
  double constant = 0.0;
  term_list terms; ///< (segment, coefficient)
};

/// One step of a program: per-device compute and communication seconds.
struct ratio_step {
  std::string name;
  std::vector<linear_cost> compute; ///< one per device (empty: no compute)
  std::vector<linear_cost> comm;    ///< one per device (empty: no communication)
};

/// The input of the ratio LP. Units: seconds and bytes.
struct ratio_problem {
  std::vector<std::string> segments; ///< names, e.g. "batch"
  std::vector<std::string> devices;  ///< names, one per rank
  std::vector<ratio_step> steps;
  std::vector<linear_cost> memory; ///< per device, bytes (empty: no memory model)
  std::vector<double> capacity;    ///< per device, bytes
};

/// Why a row binds: device `device`'s compute or communication in step `step`, or its memory.
struct bottleneck {
  enum class kind : unsigned char { compute, communication, memory } what = kind::compute;
  std::size_t step = 0;      ///< meaningless for memory
  std::size_t device = 0;    ///< the device (a representative when `identical` > 1)
  std::size_t identical = 1; ///< devices that share this row in the collapsed form
  double dual = 0.0;         ///< seconds of step time per unit of the row (memory: per byte)
  std::string text;          ///< "device gpu1: compute in step attn binds (LP dual 0.7: ...)"
};

/// What the ratio LP found.
struct ratio_solution {
  lp::status status = lp::status::numerical_trouble;
  std::string message;                     ///< one line for a non-optimal status
  std::vector<std::vector<double>> ratios; ///< [segment][device]
  double step_time = 0.0;                  ///< the model's cost at these ratios, constants included
  bool collapsed = false;                  ///< which form was solved
  std::vector<bottleneck> bottlenecks;     ///< binding rows with positive duals, largest first
  lp::basis basis;                         ///< warm start for the same form and sizes
  std::size_t iterations = 0;
};

namespace detail {

// A cost must be >= 0 at every ratio in [0, 1]: coefficients may be negative (a native
// all-gather costs alpha + beta B (1 - r_d)) as long as the constant covers them.
inline void check_cost(const linear_cost& c, std::size_t segments, const std::string& where) {
  if (!(c.constant >= 0.0) || !std::isfinite(c.constant))
    throw plan_error(where, "constant " + std::to_string(c.constant),
                     "costs are seconds or bytes >= 0");
  double lowest = c.constant;
  for (const auto& [s, a] : c.terms) {
    if (s >= segments || !std::isfinite(a))
      throw plan_error(
          where, "term (segment " + std::to_string(s) + ", coefficient " + std::to_string(a) + ")",
          "a known segment and a finite coefficient");
    lowest += std::min(a, 0.0);
  }
  if (lowest < -1e-9 * std::max(1.0, c.constant))
    throw plan_error(where, "negative at some ratios (lowest " + std::to_string(lowest) + ")",
                     "costs >= 0 for every ratio in [0, 1]");
}

inline void validate(const ratio_problem& p) {
  const std::size_t n = p.devices.size();
  if (p.segments.empty() || n == 0)
    throw plan_error("ratio LP", "no segments or no devices", "at least one of each");
  for (const auto& st : p.steps) {
    if ((!st.compute.empty() && st.compute.size() != n) ||
        (!st.comm.empty() && st.comm.size() != n))
      throw plan_error("ratio LP step \"" + st.name + "\"",
                       "cost lists do not have one entry per device",
                       std::to_string(n) + " devices");
    for (std::size_t d = 0; d < st.compute.size(); ++d)
      check_cost(st.compute[d], p.segments.size(),
                 "ratio LP step \"" + st.name + "\" compute on " + p.devices[d]);
    for (std::size_t d = 0; d < st.comm.size(); ++d)
      check_cost(st.comm[d], p.segments.size(),
                 "ratio LP step \"" + st.name + "\" comm on " + p.devices[d]);
  }
  if (!p.memory.empty() && (p.memory.size() != n || p.capacity.size() != n))
    throw plan_error("ratio LP memory", "memory and capacity need one entry per device",
                     std::to_string(n) + " devices");
  for (std::size_t d = 0; d < p.memory.size(); ++d)
    check_cost(p.memory[d], p.segments.size(), "ratio LP memory of " + p.devices[d]);
}

inline double evaluate(const linear_cost& c, const std::vector<std::vector<double>>& r,
                       std::size_t d) {
  double v = c.constant;
  for (const auto& [s, a] : c.terms)
    v += a * r[s][d];
  return v;
}

// Coefficient of r[s][d] in c (terms on the same segment are summed).
inline double coefficient(const linear_cost& c, std::size_t s) {
  double a = 0.0;
  for (const auto& [seg, v] : c.terms)
    if (seg == s)
      a += v;
  return a;
}

// The single segment a step's costs depend on; nullopt if none; npos-like if several.
inline std::optional<std::size_t> step_segment(const ratio_step& st, bool& several) {
  std::optional<std::size_t> seg;
  for (const auto* list : {&st.compute, &st.comm})
    for (const auto& c : *list)
      for (const auto& [s, a] : c.terms) {
        if (a == 0.0)
          continue;
        if (seg && *seg != s)
          several = true;
        seg = s;
      }
  return seg;
}

// For steps of one segment, a_{k,d} = f_k * g_d with device-independent constants? Returns g
// (per device) and f (per step), or nullopt.
inline std::optional<std::pair<std::vector<double>, std::vector<double>>>
factor(const std::vector<const std::vector<linear_cost>*>& per_step, std::size_t s,
       std::size_t devices) {
  std::vector<std::vector<double>> a;
  for (const auto* costs : per_step) {
    if (costs->empty()) {
      a.emplace_back(devices, 0.0);
      continue;
    }
    std::vector<double> row(devices);
    for (std::size_t d = 0; d < devices; ++d) {
      row[d] = coefficient((*costs)[d], s);
      if ((*costs)[d].constant != (*costs)[0].constant)
        return std::nullopt;
    }
    a.push_back(std::move(row));
  }
  std::size_t k0 = 0;
  double best = -1.0;
  double amax = 0.0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    double sum = 0.0;
    for (double v : a[k]) {
      sum += v;
      amax = std::max(amax, v);
    }
    if (sum > best) {
      best = sum;
      k0 = k;
    }
  }
  std::vector<double> g = a.empty() ? std::vector<double>(devices, 0.0) : a[k0];
  std::vector<double> f(a.size(), 0.0);
  const auto dstar = static_cast<std::size_t>(std::max_element(g.begin(), g.end()) - g.begin());
  for (std::size_t k = 0; k < a.size(); ++k) {
    f[k] = g[dstar] > 0.0 ? a[k][dstar] / g[dstar] : 0.0;
    for (std::size_t d = 0; d < devices; ++d)
      if (std::abs(a[k][d] - f[k] * g[d]) > 1e-12 * std::max(1.0, amax))
        return std::nullopt;
  }
  return std::make_pair(std::move(g), std::move(f));
}

inline std::string percent(double v) {
  std::ostringstream s;
  s.precision(3);
  s << 100.0 * v << "%";
  return s.str();
}

inline std::string bytes_text(double b) {
  std::ostringstream s;
  s.precision(4);
  if (b >= 1073741824.0)
    s << b / 1073741824.0 << " GiB";
  else if (b >= 1048576.0)
    s << b / 1048576.0 << " MiB";
  else if (b >= 1024.0)
    s << b / 1024.0 << " KiB";
  else
    s << b << " B";
  return s.str();
}

// A one-line account of why memory makes the LP infeasible.
inline std::string memory_infeasibility(const ratio_problem& p) {
  for (std::size_t d = 0; d < p.devices.size(); ++d)
    if (p.memory[d].constant > p.capacity[d])
      return "device " + p.devices[d] + " needs " + bytes_text(p.memory[d].constant) +
             " before any shard but has " + bytes_text(p.capacity[d]);
  // Per segment, with the other segments' shares at zero: the most each device can take.
  for (std::size_t s = 0; s < p.segments.size(); ++s) {
    double total = 0.0;
    std::string detail_text;
    for (std::size_t d = 0; d < p.devices.size(); ++d) {
      const double per_unit = coefficient(p.memory[d], s);
      const double room = p.capacity[d] - p.memory[d].constant;
      const double most = per_unit > 0.0 ? std::min(1.0, room / per_unit) : 1.0;
      total += most;
      detail_text += (d == 0 ? "" : "; ") + p.devices[d] + " at most " + percent(most) + " (" +
                     bytes_text(room) + " free of " + bytes_text(p.capacity[d]) + ", " +
                     bytes_text(per_unit) + " for the whole segment)";
    }
    if (total < 1.0)
      return "memory: segment " + p.segments[s] + " fits at most " + percent(total) +
             " on the devices (" + detail_text + ")";
  }
  return "memory: no split of the segments fits every device's capacity together";
}

} // namespace detail

/// How to solve the ratio LP.
struct ratio_options {
  lp::options lp;       ///< the simplex's tolerances and formulation
  bool collapse = true; ///< use the collapsed form where it is exact
};

/// Solves the ratio LP (collapsed form where it is exact, else the full form). Throws
/// `plan_error` for malformed input; an infeasible split is a status with a message naming the
/// device and bytes. `warm` is the `basis` of an earlier solution of the same shape.
[[nodiscard]] inline ratio_solution solve_ratios(const ratio_problem& p,
                                                 const ratio_options& opt = {},
                                                 const lp::basis* warm = nullptr) {
  detail::validate(p);
  const std::size_t segs = p.segments.size();
  const std::size_t devs = p.devices.size();
  const bool has_memory = !p.memory.empty();
  ratio_solution out;

  // Can the problem be collapsed? Every step on one segment; per segment and kind, factorable.
  bool several = false;
  std::vector<std::optional<std::size_t>> seg_of(p.steps.size());
  for (std::size_t k = 0; k < p.steps.size(); ++k)
    seg_of[k] = detail::step_segment(p.steps[k], several);
  struct segment_factors {
    std::vector<double> g, h; // per device: compute and comm slopes
    double f_sum = 0.0, h_sum = 0.0;
  };
  std::vector<segment_factors> sf(segs);
  bool collapsible = opt.collapse && !several;
  for (std::size_t s = 0; s < segs && collapsible; ++s) {
    std::vector<const std::vector<linear_cost>*> comp;
    std::vector<const std::vector<linear_cost>*> comm;
    for (std::size_t k = 0; k < p.steps.size(); ++k)
      if (seg_of[k] == s) {
        comp.push_back(&p.steps[k].compute);
        comm.push_back(&p.steps[k].comm);
      }
    const auto fc = detail::factor(comp, s, devs);
    const auto fm = detail::factor(comm, s, devs);
    if (!fc || !fm) {
      collapsible = false;
      break;
    }
    sf[s].g = fc->first;
    sf[s].h = fm->first;
    for (double f : fc->second)
      sf[s].f_sum += f;
    for (double f : fm->second)
      sf[s].h_sum += f;
  }
  // Steps without any ratio dependence must also have device-independent constants to collapse.
  for (std::size_t k = 0; k < p.steps.size() && collapsible; ++k)
    if (!seg_of[k])
      for (const auto* list : {&p.steps[k].compute, &p.steps[k].comm})
        for (const auto& c : *list)
          collapsible = collapsible && c.constant == (*list)[0].constant;

  lp::problem q;
  std::vector<std::vector<std::size_t>> rvar(segs); // LP variable of r[s][d] (class variable)
  struct row_meaning {
    bool ratio_sum = true; // a "ratios sum to 1" row: no bottleneck to report
    bottleneck::kind what = bottleneck::kind::compute;
    std::size_t step = 0;   // step (full) or segment (collapsed)
    std::size_t device = 0; // device (full) or class representative (collapsed)
  };
  std::vector<row_meaning> meaning; // per LP row (sum rows get an unused entry)
  std::vector<std::size_t> class_of(devs);
  std::vector<std::size_t> class_rep; // representative device per class
  std::vector<double> class_size;

  if (collapsible) {
    out.collapsed = true;
    // Device classes: identical slopes in every segment and identical memory model.
    for (std::size_t d = 0; d < devs; ++d) {
      std::size_t c = 0;
      for (; c < class_rep.size(); ++c) {
        const std::size_t e = class_rep[c];
        bool same = true;
        for (std::size_t s = 0; s < segs; ++s)
          same = same && sf[s].g[d] == sf[s].g[e] && sf[s].h[d] == sf[s].h[e];
        if (has_memory) {
          same = same && p.capacity[d] == p.capacity[e] &&
                 p.memory[d].constant == p.memory[e].constant;
          for (std::size_t s = 0; s < segs; ++s)
            same =
                same && detail::coefficient(p.memory[d], s) == detail::coefficient(p.memory[e], s);
        }
        if (same)
          break;
      }
      if (c == class_rep.size()) {
        class_rep.push_back(d);
        class_size.push_back(0.0);
      }
      class_of[d] = c;
      class_size[c] += 1.0;
    }
    for (std::size_t s = 0; s < segs; ++s) {
      std::vector<lp::term> sum;
      for (std::size_t c = 0; c < class_rep.size(); ++c) {
        rvar[s].push_back(
            q.add_variable("r[" + p.segments[s] + "][" + p.devices[class_rep[c]] + "]"));
        sum.push_back({rvar[s].back(), class_size[c]});
      }
      q.add_row("sum " + p.segments[s], sum, lp::relation::equal, 1.0);
      meaning.push_back({});
      const auto x = q.add_variable("compute max " + p.segments[s], 0, lp::inf, sf[s].f_sum);
      const auto y = q.add_variable("comm max " + p.segments[s], 0, lp::inf, sf[s].h_sum);
      for (std::size_t c = 0; c < class_rep.size(); ++c) {
        const std::size_t d = class_rep[c];
        if (sf[s].f_sum > 0.0) {
          q.add_row("compute " + p.segments[s] + " " + p.devices[d],
                    {{x, 1.0}, {rvar[s][c], -sf[s].g[d]}}, lp::relation::greater_equal, 0.0);
          meaning.push_back({false, bottleneck::kind::compute, s, d});
        }
        if (sf[s].h_sum > 0.0) {
          q.add_row("comm " + p.segments[s] + " " + p.devices[d],
                    {{y, 1.0}, {rvar[s][c], -sf[s].h[d]}}, lp::relation::greater_equal, 0.0);
          meaning.push_back({false, bottleneck::kind::communication, s, d});
        }
      }
    }
    if (has_memory)
      for (std::size_t c = 0; c < class_rep.size(); ++c) {
        const std::size_t d = class_rep[c];
        std::vector<lp::term> terms;
        for (std::size_t s = 0; s < segs; ++s)
          if (const double a = detail::coefficient(p.memory[d], s); a > 0.0)
            terms.push_back({rvar[s][c], a});
        q.add_row("memory " + p.devices[d], terms, lp::relation::less_equal,
                  p.capacity[d] - p.memory[d].constant);
        meaning.push_back({false, bottleneck::kind::memory, 0, d});
      }
  } else {
    for (std::size_t d = 0; d < devs; ++d)
      class_of[d] = d;
    for (std::size_t s = 0; s < segs; ++s) {
      std::vector<lp::term> sum;
      for (std::size_t d = 0; d < devs; ++d) {
        rvar[s].push_back(q.add_variable("r[" + p.segments[s] + "][" + p.devices[d] + "]"));
        sum.push_back({rvar[s].back(), 1.0});
      }
      q.add_row("sum " + p.segments[s], sum, lp::relation::equal, 1.0);
      meaning.push_back({});
    }
    for (std::size_t k = 0; k < p.steps.size(); ++k) {
      const auto& st = p.steps[k];
      for (const auto& [list, what] : {std::pair{&st.compute, bottleneck::kind::compute},
                                       std::pair{&st.comm, bottleneck::kind::communication}}) {
        if (list->empty())
          continue;
        const auto t = q.add_variable(
            std::string(what == bottleneck::kind::compute ? "compute " : "comm ") + st.name, 0,
            lp::inf, 1.0);
        for (std::size_t d = 0; d < devs; ++d) {
          std::vector<lp::term> terms{{t, 1.0}};
          for (const auto& [s, a] : (*list)[d].terms)
            terms.push_back({rvar[s][d], -a});
          q.add_row(st.name + " " + p.devices[d], terms, lp::relation::greater_equal,
                    (*list)[d].constant);
          meaning.push_back({false, what, k, d});
        }
      }
    }
    if (has_memory)
      for (std::size_t d = 0; d < devs; ++d) {
        std::vector<lp::term> terms;
        for (const auto& [s, a] : p.memory[d].terms)
          terms.push_back({rvar[s][d], a});
        q.add_row("memory " + p.devices[d], terms, lp::relation::less_equal,
                  p.capacity[d] - p.memory[d].constant);
        meaning.push_back({false, bottleneck::kind::memory, 0, d});
      }
  }

  const lp::result r = lp::solve(q, opt.lp, warm);
  if (out.collapsed && r.status != lp::status::optimal && r.status != lp::status::infeasible) {
    // The collapsed form can report unbounded where the full form has an optimum (seen on
    // BERT-base over mixed-8.json): solve the full form, which is the reference.
    ratio_options full = opt;
    full.collapse = false;
    return solve_ratios(p, full, nullptr);
  }
  out.status = r.status;
  out.iterations = r.iterations;
  out.basis = r.final_basis;
  if (r.status == lp::status::infeasible && has_memory) {
    out.message = detail::memory_infeasibility(p);
    return out;
  }
  if (r.status != lp::status::optimal) {
    out.message = "ratio LP: " + std::string(lp::name(r.status)) + ": " + r.message;
    return out;
  }
  out.ratios.assign(segs, std::vector<double>(devs, 0.0));
  for (std::size_t s = 0; s < segs; ++s)
    for (std::size_t d = 0; d < devs; ++d)
      out.ratios[s][d] = std::max(0.0, r.x[rvar[s][class_of[d]]]);

  // The model's own cost at these ratios (constants included), not the LP objective.
  for (const auto& st : p.steps) {
    double c = 0.0;
    double m = 0.0;
    for (std::size_t d = 0; d < st.compute.size(); ++d)
      c = std::max(c, detail::evaluate(st.compute[d], out.ratios, d));
    for (std::size_t d = 0; d < st.comm.size(); ++d)
      m = std::max(m, detail::evaluate(st.comm[d], out.ratios, d));
    out.step_time += c + m;
  }

  // Binding rows with nonzero duals, mapped back to steps and devices.
  for (std::size_t i = 0; i < q.row_count(); ++i) {
    // Duals of step rows are shares of blame (they sum to 1 per step); memory duals are
    // seconds per byte, so they count when a capacity's worth of them matters.
    const double y = r.duals[i];
    const double weight =
        meaning[i].what == bottleneck::kind::memory
            ? std::abs(y) * p.capacity[meaning[i].device] / std::max(out.step_time, 1e-300)
            : std::abs(y);
    if (meaning[i].ratio_sum || weight <= 1e-9)
      continue;
    const row_meaning& mn = meaning[i];
    const std::size_t identical =
        out.collapsed ? static_cast<std::size_t>(class_size[class_of[mn.device]]) : 1U;
    const auto add = [&](std::size_t step, double dual) {
      bottleneck b;
      b.what = mn.what;
      b.step = step;
      b.device = mn.device;
      b.identical = identical;
      b.dual = dual;
      std::ostringstream t;
      t << "device " << p.devices[mn.device];
      if (identical > 1)
        t << " (and " << identical - 1 << " identical devices)";
      if (mn.what == bottleneck::kind::memory)
        t << ": memory binds (" << -dual << " s of step time per extra byte of each device)";
      else {
        // An op's step reads "in step attn"; a summary step ("replicated work and fixed-size
        // collectives", "12 steps (...)") reads "of ...".
        const std::string& name = p.steps[step].name;
        t << ": " << (mn.what == bottleneck::kind::compute ? "compute" : "communication")
          << (name.find(' ') != std::string::npos ? " of " : " in step ") << name
          << " binds (LP dual " << std::setprecision(3) << dual
          << ": seconds of step time per second of this row)";
      }
      b.text = t.str();
      out.bottlenecks.push_back(std::move(b));
    };
    if (mn.what == bottleneck::kind::memory) {
      add(0, y / static_cast<double>(identical));
    } else if (!out.collapsed) {
      add(mn.step, y);
    } else {
      // Collapsed row of segment s (objective weight F_s = sum of the steps' slopes): in the full
      // form each step of the segment would carry dual y / F_s, shared by the class's devices.
      const std::size_t s = mn.step;
      const double total = mn.what == bottleneck::kind::compute ? sf[s].f_sum : sf[s].h_sum;
      for (std::size_t k = 0; k < p.steps.size(); ++k) {
        const auto& list =
            mn.what == bottleneck::kind::compute ? p.steps[k].compute : p.steps[k].comm;
        if (seg_of[k] == s && !list.empty() && detail::coefficient(list[mn.device], s) != 0.0)
          add(k, y / total);
      }
    }
  }
  std::stable_sort(
      out.bottlenecks.begin(), out.bottlenecks.end(),
      [](const bottleneck& a, const bottleneck& b) { return std::abs(a.dual) > std::abs(b.dual); });
  return out;
}

} // namespace hspmd::synth
