#pragma once
// Where a training loop's feed puts a micro-batch (the trainer, its engines and user feeds share
// it): the whole batch by input name; a distributed rank keeps its piece.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
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

} // namespace hspmd::exec
