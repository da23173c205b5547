#pragma once
// What crosses a pipeline's stage boundaries (exec/pipeline.hpp), known alike on every rank
// without building the stage graphs: per stage, the values it sends -- nodes a later stage reads,
// in node order, as graph::extract_stage lists them -- and per value the later stages that read
// it; and the message tag of each (producer, reader, direction, value). (How many micro-batches
// a schedule holds at once: program::in_flight_per_chunk.)

#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/program/pipeline.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// A communicator that sends without blocking (`start_send` and its request).
template <class C, class T>
concept async_sender = requires(C& c, std::span<const T> data, typename C::request& r) {
  { c.start_send(data, 0, 0) } -> std::same_as<typename C::request>;
  { c.test(r) } -> std::convertible_to<bool>;
  c.wait(r);
};

/// The values crossing the boundaries of `cuts` (see the file comment).
struct pipeline_boundaries {
  std::vector<std::size_t> stage_of;                          ///< per node of the graph
  std::vector<std::vector<graph::node_id>> sent;              ///< per stage
  std::vector<std::vector<std::vector<std::size_t>>> readers; ///< per stage, per sent value
  std::size_t values_per_boundary = 1;                        ///< the most a stage sends

  pipeline_boundaries() = default;
  pipeline_boundaries(const graph::graph& g, std::span<const graph::node_range> cuts)
      : stage_of(g.size()), sent(cuts.size()), readers(cuts.size()) {
    for (std::size_t k = 0; k < cuts.size(); ++k)
      for (graph::node_id i = cuts[k].first; i <= cuts[k].second; ++i)
        stage_of[i] = k;
    std::vector<std::vector<std::size_t>> by_node(g.size());
    for (graph::node_id j = 0; j < g.size(); ++j)
      for (graph::node_id in : g[j].inputs)
        if (stage_of[j] != stage_of[in] && g[in].kind != graph::op::input &&
            std::ranges::find(by_node[in], stage_of[j]) == by_node[in].end())
          by_node[in].push_back(stage_of[j]);
    for (graph::node_id i = 0; i < g.size(); ++i)
      if (!by_node[i].empty()) {
        sent[stage_of[i]].push_back(i);
        readers[stage_of[i]].push_back(by_node[i]);
      }
    for (const auto& v : sent)
      values_per_boundary = std::max(values_per_boundary, v.size());
  }

  [[nodiscard]] std::size_t stages() const noexcept { return sent.size(); }
  /// The stage that sends whole-graph node `global`, and its index among the stage's values.
  [[nodiscard]] std::pair<std::size_t, std::size_t> producer_of(graph::node_id global) const {
    const std::size_t k = stage_of.at(global);
    const auto at = std::ranges::find(sent[k], global) - sent[k].begin();
    return {k, static_cast<std::size_t>(at)};
  }
  /// The tag of value q of stage `producer` read by stage `reader`, forward or its gradient
  /// back: distinct for every (producer, reader, direction, value).
  [[nodiscard]] int tag(std::size_t producer, std::size_t reader, bool backward,
                        std::size_t q) const {
    return static_cast<int>(
        ((producer * stages() + reader) * 2 + (backward ? 1 : 0)) * values_per_boundary + q);
  }
  /// Whether every tag fits the range MPI guarantees (0 .. 32767).
  [[nodiscard]] bool tags_fit() const {
    return stages() * stages() * 2 * values_per_boundary <= 32767;
  }
};

} // namespace hspmd::exec
