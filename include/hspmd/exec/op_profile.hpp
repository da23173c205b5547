#pragma once
// Time per op kind and per node, forward and backward, as the executor runs (while on; the
// executor measures through its backend's `timed`), and the table `--profile` prints.

#include <hspmd/graph/ir.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <ostream>
#include <span>
#include <string>
#include <vector>

namespace hspmd::exec {

/// Seconds spent forward and backward.
struct profile_entry {
  double forward = 0.0;
  double backward = 0.0;
};

/// Accumulates seconds per op kind and per node while on.
class op_profiler {
public:
  /// Starts (clearing earlier totals) or stops accumulating for a graph of `nodes` nodes.
  void set(bool on, std::size_t nodes) {
    on_ = on;
    if (on) {
      per_kind_.assign(graph::op_count, profile_entry{});
      per_node_.assign(nodes, profile_entry{});
    }
  }
  [[nodiscard]] bool on() const noexcept { return on_; }
  /// Adds `seconds` to node `id` of kind `kind`, forward or backward.
  void add(graph::op kind, graph::node_id id, bool backward, double seconds) {
    auto& e = per_kind_[static_cast<std::size_t>(kind)];
    (backward ? e.backward : e.forward) += seconds;
    (backward ? per_node_[id].backward : per_node_[id].forward) += seconds;
  }
  [[nodiscard]] const std::vector<profile_entry>& per_kind() const noexcept { return per_kind_; }
  [[nodiscard]] const std::vector<profile_entry>& per_node() const noexcept { return per_node_; }

private:
  bool on_ = false;
  std::vector<profile_entry> per_kind_, per_node_;
};

/// Writes a per-op-kind profile as a table, most expensive first: op, forward and backward
/// milliseconds per step (totals divided by `steps`), and share of the graph's time.
inline void write_profile(std::ostream& out, std::span<const profile_entry> p, std::size_t steps) {
  std::vector<std::size_t> kinds;
  double total = 0.0;
  for (std::size_t k = 0; k < p.size(); ++k)
    if (p[k].forward + p[k].backward > 0.0) {
      kinds.push_back(k);
      total += p[k].forward + p[k].backward;
    }
  std::ranges::stable_sort(kinds, [&](std::size_t a, std::size_t b) {
    return p[a].forward + p[a].backward > p[b].forward + p[b].backward;
  });
  const double per = 1e3 / static_cast<double>(std::max<std::size_t>(steps, 1));
  char line[160];
  std::snprintf(line, sizeof line, "%-22s %12s %12s %8s\n", "op", "forward ms", "backward ms",
                "share");
  out << line;
  for (auto k : kinds) {
    std::snprintf(line, sizeof line, "%-22s %12.2f %12.2f %7.1f%%\n",
                  std::string(graph::name(static_cast<graph::op>(k))).c_str(), p[k].forward * per,
                  p[k].backward * per, 100.0 * (p[k].forward + p[k].backward) / total);
    out << line;
  }
  std::snprintf(line, sizeof line, "%-22s %25.2f ms per step\n", "graph total", total * per);
  out << line;
}

} // namespace hspmd::exec
