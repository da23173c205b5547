#pragma once
// Where a training loop's feed puts a micro-batch (the trainer, its engines and user feeds share
// it): the whole batch by input name; a distributed rank keeps its piece.

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::exec {

/// Where a feed puts a micro-batch: the whole batch, by input name (a distributed rank keeps
/// its piece).
template <std::floating_point T>
class batch_sink {
public:
  virtual ~batch_sink() = default;
  virtual void set_input(std::string_view name, std::span<const T> values) = 0;
  virtual void set_input(std::string_view name, std::span<const std::int64_t> ids) = 0;
  void set_input(std::string_view name, const std::vector<T>& v) {
    set_input(name, std::span<const T>(v));
  }
  void set_input(std::string_view name, const std::vector<std::int64_t>& v) {
    set_input(name, std::span<const std::int64_t>(v));
  }
};

/// Fills micro-batch `index` (training: step * accumulate + micro; evaluation: 0, 1, ...).
template <std::floating_point T>
using feed_fn = std::function<void(batch_sink<T>&, std::size_t index)>;

/// The input node `name` of `g` that a sink is fed, ids (`ids`) or features; throws
/// `plan_error` (from `who`) naming the input and the fix when there is none or its type is the
/// other.
[[nodiscard]] inline graph::node_id input_node(const graph::graph& g, std::string_view name,
                                               bool ids, const char* who) {
  const auto id = g.find(name);
  if (!id || g[*id].kind != graph::op::input)
    throw plan_error(who, "no input named \"" + std::string(name) + "\"",
                     "feed the inputs the model declared");
  if ((g[*id].type == dtype::i64) != ids)
    throw plan_error("input \"" + std::string(name) + "\"",
                     ids ? "is not an integer input" : "is an integer input",
                     "feed ids as int64 and features as floating point");
  return *id;
}

} // namespace hspmd::exec
