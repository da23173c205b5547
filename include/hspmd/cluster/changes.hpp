#pragma once
// Changes to a cluster as a user says them: "add 2 x a100", "remove node 3", "remove gpu7",
// "slow gpu7 x2". `parse_change` reads one, `apply` makes it (the result validated as a cluster
// file would be). Used by what-if planning (sim/what_if.hpp) and by the elastic launcher
// (hspmd-run), which removes the devices a failure lost. Bad changes throw config_error naming
// the change and what would be accepted.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/error.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd {

/// One change to a cluster.
struct cluster_change {
  enum class kind : std::uint8_t { add, remove_node, remove_device, slow } what = kind::slow;
  std::size_t count = 0; ///< add: how many devices
  std::string device;    ///< add: a device kind (or name) to copy; remove/slow: a device name
  std::int64_t node = 0; ///< remove_node
  double factor = 1.0;   ///< slow: its speed is divided by this (below 1: faster)
  std::string text;      ///< as the user wrote it
};

namespace change_detail {

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

} // namespace change_detail

/// Parses "add N x KIND", "remove node K", "remove DEVICE" or "slow DEVICE xF" (words separated
/// by spaces; "x" may be written against its number: "2x", "x2").
[[nodiscard]] inline cluster_change parse_change(std::string_view text) {
  const std::string where = "what-if \"" + std::string(text) + "\"";
  const std::string forms =
      "write \"add 2 x a100\", \"remove node 3\", \"remove gpu7\" or \"slow gpu7 x2\"";
  std::vector<std::string> w = change_detail::words(text);
  // "2x" / "x2" -> "2", "x" / "x", "2"
  std::vector<std::string> t;
  for (const std::string& s : w) {
    if (s.size() > 1 && (s.front() == 'x' || s.front() == 'X') &&
        change_detail::number<double>(std::string_view(s).substr(1))) {
      t.emplace_back("x");
      t.push_back(s.substr(1));
    } else if (s.size() > 1 && (s.back() == 'x' || s.back() == 'X') &&
               change_detail::number<double>(std::string_view(s).substr(0, s.size() - 1))) {
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
  const std::string verb = change_detail::lower(t[0]);
  if (verb == "add") {
    const auto n = t.size() == 4 ? change_detail::number<std::size_t>(t[1]) : std::nullopt;
    if (!n || *n == 0 || change_detail::lower(t[2]) != "x")
      throw config_error(where, "is not \"add N x KIND\" with N at least 1", forms);
    c.what = cluster_change::kind::add;
    c.count = *n;
    c.device = t[3];
    return c;
  }
  if (verb == "remove") {
    if (t.size() == 3 && change_detail::lower(t[1]) == "node") {
      const auto k = change_detail::number<std::int64_t>(t[2]);
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
    const auto f = t.size() == 4 && change_detail::lower(t[2]) == "x"
                       ? change_detail::number<double>(t[3])
                       : std::nullopt;
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
    const std::string want = change_detail::lower(change.device);
    auto like = std::ranges::find_if(c.devices, [&](const device_spec& d) {
      return change_detail::lower(d.kind) == want || change_detail::lower(d.name) == want;
    });
    if (like == c.devices.end()) {
      std::vector<std::string> begun;
      for (auto it = c.devices.begin(); it != c.devices.end(); ++it)
        if (change_detail::lower(it->kind).starts_with(want) &&
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

} // namespace hspmd
