#pragma once
// One evaluation pass of the library trainer (train/trainer_impl.hpp): forward only, dropout
// off, over a number of micro-batches; the mean loss, and for a classifier (a cross-entropy
// loss) its accuracy -- the logits' arg-max against the targets as fed, through reshapes -- or
// its perplexity (train_options::metric). Collective in a distributed run, like the engine.

#include <hspmd/exec/batch_sink.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/results.hpp>
#include <hspmd/train/train_options.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::train {

/// Evaluates `g` on engine `e` over `batches` micro-batches fed by `feed` (see the file comment);
/// `after_step`: the steps trained before it.
template <std::floating_point T, class Optimizer>
[[nodiscard]] eval_report evaluate(engine<T, Optimizer>& e, const graph::graph& g,
                                   eval_metric metric, const feed_fn<T>& feed, std::size_t batches,
                                   std::size_t after_step) {
  e.set_training(false);
  eval_report rep;
  rep.after_step = after_step;
  const graph::node& loss_node = g[*g.loss()];
  const bool classify = loss_node.kind == graph::op::cross_entropy;
  std::optional<graph::node_id> targets;
  if (classify) {
    graph::node_id t = loss_node.inputs[1];
    while (g[t].kind == graph::op::reshape)
      t = g[t].inputs[0];
    if (g[t].kind == graph::op::input)
      targets = t;
  }
  // Passes every input on and keeps a copy of the targets' ids.
  struct capture final : batch_sink<T> {
    batch_sink<T>* inner;
    std::string name;
    std::vector<std::int64_t> ids;
    void set_input(std::string_view n, std::span<const T> v) override { inner->set_input(n, v); }
    void set_input(std::string_view n, std::span<const std::int64_t> v) override {
      if (n == name)
        ids.assign(v.begin(), v.end());
      inner->set_input(n, v);
    }
    using batch_sink<T>::set_input;
  } sink;
  sink.inner = &e;
  sink.name = targets ? g[*targets].name : std::string();
  double loss = 0.0;
  std::size_t right = 0;
  std::size_t rows = 0;
  for (std::size_t b = 0; b < batches; ++b) {
    e.set_step(0);
    feed(sink, b);
    loss += e.forward();
    if (classify && targets && metric == eval_metric::accuracy) {
      const auto logits = e.whole(loss_node.inputs[0]);
      const std::size_t v = g[loss_node.inputs[0]].out.dims[1];
      for (std::size_t i = 0; i < sink.ids.size() && (i + 1) * v <= logits.size(); ++i) {
        const auto row = std::span<const T>(logits).subspan(i * v, v);
        const auto best = static_cast<std::int64_t>(std::ranges::max_element(row) - row.begin());
        right += best == sink.ids[i] ? 1U : 0U;
        ++rows;
      }
    }
  }
  e.set_training(true);
  rep.loss = loss / static_cast<double>(batches);
  if (classify && metric == eval_metric::perplexity) {
    const double per_row = loss_node.attrs.scalar > 0.0
                               ? rep.loss
                               : rep.loss / static_cast<double>(g[loss_node.inputs[0]].out.dims[0]);
    rep.perplexity = std::exp(per_row);
  }
  if (rows > 0)
    rep.accuracy = static_cast<double>(right) / static_cast<double>(rows);
  return rep;
}

} // namespace hspmd::train
