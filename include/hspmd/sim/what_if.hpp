#pragma once
// What if the cluster changed? Changes a cluster as a user says it ("add 2 x a100", "remove node
// 3", "remove gpu7", "slow gpu7 x2"), plans the model again on the changed cluster, and says what
// that does to the plan, the step time (the cost model's and the simulator's), the shares and
// the bottleneck (the ratio LP's binding rows). Where the change keeps the cluster's shape (a
// device slower or faster), the old program is also re-balanced alone — its ratio LP re-solved
// from the old basis, as the trainer's --rebalance does — so the answer shows what re-planning
// buys over re-balancing.
//
//     const cluster changed = sim::apply_all(c, {"slow gpu7 x2"});
//     sim::what_if_answer a = sim::what_if(g, c, changed, opt, "bert", plan);
//
// Bad changes throw config_error naming the change and what would be accepted.

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

/// One change to a cluster.
struct cluster_change {
  enum class kind : std::uint8_t { add, remove_node, remove_device, slow } what = kind::slow;
  std::size_t count = 0; ///< add: how many devices
  std::string device;    ///< add: a device kind (or name) to copy; remove/slow: a device name
  std::int64_t node = 0; ///< remove_node
  double factor = 1.0;   ///< slow: its speed is divided by this (below 1: faster)
  std::string text;      ///< as the user wrote it
};

namespace detail {

[[nodiscard]] inline std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  std::istringstream in{std::string(s)};
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

[[nodiscard]] inline std::string lower(std::string s) {
  for (char& ch : s)
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

template <class N>
[[nodiscard]] std::optional<N> number(std::string_view s) {
  N v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size())
    return std::nullopt;
  return v;
}

} // namespace detail

/// Parses "add N x KIND", "remove node K", "remove DEVICE" or "slow DEVICE xF" (words separated
/// by spaces; "x" may be written against its number: "2x", "x2").
[[nodiscard]] inline cluster_change parse_change(std::string_view text) {
  const std::string where = "what-if \"" + std::string(text) + "\"";
  const std::string forms =
      "write \"add 2 x a100\", \"remove node 3\", \"remove gpu7\" or \"slow gpu7 x2\"";
  std::vector<std::string> w = detail::words(text);
  // "2x" / "x2" -> "2", "x" / "x", "2"
  std::vector<std::string> t;
  for (const std::string& s : w) {
    if (s.size() > 1 && (s.front() == 'x' || s.front() == 'X') &&
        detail::number<double>(std::string_view(s).substr(1))) {
      t.emplace_back("x");
      t.push_back(s.substr(1));
    } else if (s.size() > 1 && (s.back() == 'x' || s.back() == 'X') &&
               detail::number<double>(std::string_view(s).substr(0, s.size() - 1))) {
      t.push_back(s.substr(0, s.size() - 1));
      t.emplace_back("x");
    } else {
      t.push_back(s);
    }
  }
  cluster_change c;
  c.text = std::string(text);
  if (t.empty())
    throw config_error(where, "says no change", forms);
  const std::string verb = detail::lower(t[0]);
  if (verb == "add") {
    const auto n = t.size() == 4 ? detail::number<std::size_t>(t[1]) : std::nullopt;
    if (!n || *n == 0 || detail::lower(t[2]) != "x")
      throw config_error(where, "is not \"add N x KIND\" with N at least 1", forms);
    c.what = cluster_change::kind::add;
    c.count = *n;
    c.device = t[3];
    return c;
  }
  if (verb == "remove") {
    if (t.size() == 3 && detail::lower(t[1]) == "node") {
      const auto k = detail::number<std::int64_t>(t[2]);
      if (!k)
        throw config_error(where, "names no node number", forms);
      c.what = cluster_change::kind::remove_node;
      c.node = *k;
      return c;
    }
    if (t.size() != 2)
      throw config_error(where, "is not \"remove node K\" or \"remove DEVICE\"", forms);
    c.what = cluster_change::kind::remove_device;
    c.device = t[1];
    return c;
  }
  if (verb == "slow") {
    const auto f =
        t.size() == 4 && detail::lower(t[2]) == "x" ? detail::number<double>(t[3]) : std::nullopt;
    if (!f || !(*f > 0.0) || !std::isfinite(*f))
      throw config_error(where, "is not \"slow DEVICE xF\" with F positive", forms);
    c.what = cluster_change::kind::slow;
    c.device = t[1];
    c.factor = *f;
    return c;
  }
  throw config_error(where, "starts with \"" + t[0] + "\"", forms);
}

/// `c` changed by `change`; validated as a cluster file would be.
[[nodiscard]] inline cluster apply(const cluster& c, const cluster_change& change) {
  const std::string where = "what-if \"" + change.text + "\"";
  cluster out = c;
  const auto names = [&] {
    std::string s;
    for (std::size_t d = 0; d < c.size() && d < 4; ++d)
      s += (d == 0 ? "" : ", ") + c.devices[d].name;
    return s + (c.size() > 4 ? ", ..." : "");
  };
  const auto kinds = [&] {
    std::vector<std::string> k;
    for (const device_spec& d : c.devices)
      if (std::ranges::find(k, d.kind) == k.end())
        k.push_back(d.kind);
    std::string s;
    for (const std::string& x : k)
      s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  const auto find = [&](const std::string& name) {
    const auto it = std::ranges::find(out.devices, name, &device_spec::name);
    if (it == out.devices.end())
      throw config_error(where, "no device is named \"" + name + "\"",
                         "name one of the cluster's devices: " + names());
    return it;
  };
  switch (change.what) {
  case cluster_change::kind::slow:
    find(change.device)->slow_by(change.factor);
    break;
  case cluster_change::kind::remove_device:
    out.devices.erase(find(change.device));
    break;
  case cluster_change::kind::remove_node: {
    const auto gone =
        std::erase_if(out.devices, [&](const device_spec& d) { return d.node == change.node; });
    if (gone == 0) {
      const auto nodes = c.nodes();
      throw config_error(where, "no device is on node " + std::to_string(change.node),
                         "nodes are " + std::to_string(nodes.front()) + " to " +
                             std::to_string(nodes.back()));
    }
    break;
  }
  case cluster_change::kind::add: {
    // A kind or name as written (any case), else the one kind it begins ("a100": "A100-80GB").
    const std::string want = detail::lower(change.device);
    auto like = std::ranges::find_if(c.devices, [&](const device_spec& d) {
      return detail::lower(d.kind) == want || detail::lower(d.name) == want;
    });
    if (like == c.devices.end()) {
      std::vector<std::string> begun;
      for (auto it = c.devices.begin(); it != c.devices.end(); ++it)
        if (detail::lower(it->kind).starts_with(want) &&
            std::ranges::find(begun, it->kind) == begun.end()) {
          begun.push_back(it->kind);
          if (begun.size() == 1)
            like = it;
        }
      if (begun.size() > 1)
        throw config_error(where, "\"" + change.device + "\" begins several kinds",
                           "name one of them: " + kinds());
    }
    if (like == c.devices.end())
      throw config_error(where, "no device is of kind or named \"" + change.device + "\"",
                         "add copies of a kind the cluster has: " + kinds());
    // A new node where the cluster has links between nodes, else the last node.
    const auto nodes = c.nodes();
    const std::int64_t node = c.inter_node ? nodes.back() + 1 : nodes.back();
    // Named after the kind (as a device name may be written) and their place in the cluster,
    // so that a second "add" names its devices apart.
    std::string stem;
    for (char ch : like->kind)
      stem +=
          std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '.' || ch == '_' ? ch : '-';
    for (std::size_t k = 0; k < change.count; ++k) {
      device_spec d = *like;
      d.node = node;
      d.name = stem + "-added" + std::to_string(out.devices.size());
      out.devices.push_back(std::move(d));
    }
    break;
  }
  }
  if (out.devices.empty())
    throw config_error(where, "leaves no device", "keep at least one");
  out.name = c.name.ends_with("-what-if") ? c.name : c.name + "-what-if";
  out.description =
      (c.name.ends_with("-what-if") ? c.description + "; " : c.name + " with ") + change.text;
  return validated(out, where);
}

/// `c` changed by each of `changes` (as `parse_change` reads them) in turn.
[[nodiscard]] inline cluster apply_all(const cluster& c, const std::vector<std::string>& changes) {
  cluster out = c;
  for (const std::string& text : changes)
    out = apply(out, parse_change(text));
  return out;
}

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
