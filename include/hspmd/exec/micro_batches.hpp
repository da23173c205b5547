#pragma once
// A pipeline step's whole batch, cut into micro-batches (exec/pipeline.hpp): every rank passes
// the whole batch of each model input; micro-batch j of an input is its j-th of m equal parts
// along the first dimension, fed to whichever stages read that input.

#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace hspmd::exec {

/// The whole batch of every input of a model traced for one micro-batch (see the file comment).
template <class T>
class micro_batches {
public:
  micro_batches(const graph::graph& micro_graph, std::size_t m) : g_(&micro_graph), m_(m) {}

  /// Keeps input `name`'s whole batch, checked (on every rank alike: a rank that found it wrong
  /// later, inside the step, would leave the others waiting for its values).
  void set(std::string_view name, std::span<const T> whole) {
    check(name, whole.size(), false);
    values_[std::string(name)].assign(whole.begin(), whole.end());
  }
  void set(std::string_view name, std::span<const std::int64_t> whole) {
    check(name, whole.size(), true);
    ids_[std::string(name)].assign(whole.begin(), whole.end());
  }

  /// Micro-batch j's part of the input that node `n` (of a stage's graph) stands for.
  template <class E>
  [[nodiscard]] std::span<const E> part(const graph::node& n, std::size_t j) const {
    const std::vector<E>& whole = [&]() -> const std::vector<E>& {
      if constexpr (std::is_same_v<E, std::int64_t>)
        return find(ids_, n.name);
      else
        return find(values_, n.name);
    }();
    const std::size_t size = n.out.size();
    if (whole.size() != size * m_)
      throw shape_error("pipeline input \"" + n.name + "\"",
                        std::to_string(whole.size()) + " elements for " + std::to_string(m_) +
                            " micro-batches of " + n.out.to_string(),
                        "pass the whole batch: micro-batches x the stage graph's input");
    return std::span<const E>(whole).subspan(j * size, size);
  }

private:
  void check(std::string_view name, std::size_t size, bool ids) const {
    const graph::graph& g = *g_;
    const auto id = g.find(name);
    if (!id || g[*id].kind != graph::op::input || (g[*id].type == dtype::i64) != ids)
      throw config_error("pipeline input \"" + std::string(name) + "\"",
                         std::string("the model has no ") + (ids ? "integer" : "floating-point") +
                             " input of that name",
                         "feed the inputs the model declares");
    const std::size_t part = g[*id].out.size();
    if (size != part * m_)
      throw shape_error("pipeline input \"" + std::string(name) + "\"",
                        std::to_string(size) + " elements for " + std::to_string(m_) +
                            " micro-batches of " + g[*id].out.to_string(),
                        "pass the whole batch: m micro-batches of the graph's batch, or trace "
                        "the model for the batch / m");
  }
  template <class E>
  static const std::vector<E>& find(const std::map<std::string, std::vector<E>>& m,
                                    const std::string& name) {
    const auto it = m.find(name);
    if (it == m.end())
      throw config_error("pipeline input \"" + name + "\"", "not set",
                         "call set_input for every input of the model");
    return it->second;
  }

  const graph::graph* g_;
  std::size_t m_;
  std::map<std::string, std::vector<T>> values_;
  std::map<std::string, std::vector<std::int64_t>> ids_;
};

} // namespace hspmd::exec
