#pragma once
// Checkpoints of a pipeline run (exec/pipeline.hpp) in the one checkpoint format
// (train/checkpoint.hpp): every rank lists every parameter of the model and its optimizer
// slots, in the model's order; the ranks of a stage's group hold its parameters' pieces (the
// boxes of the stage plan's lowering), every other rank an empty box. So a checkpoint saved
// under a pipeline plan loads into any plan -- one- or two-level SPMD, another pipeline, another
// rank count -- and one saved under any plan loads into a pipeline.
//
//     auto tensors = train::pipeline_training_tensors(px, std::span(optimizers));
//     train::save_training<float>(world, root, step, std::span<const ...>(tensors), meta, {});
//     train::load_training<float>(world, path, std::span<const ...>(tensors));

#include <hspmd/exec/pipeline.hpp>
#include <hspmd/train/checkpoint.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace hspmd::train {

/// Every parameter of `px`'s model and its optimizers' slots (one optimizer per chunk), as this
/// rank holds them (see the file comment). Collective only in that every rank must call it.
template <std::floating_point T, class Comm, class Optimizer>
[[nodiscard]] std::vector<training_tensor<T>>
pipeline_training_tensors(exec::pipeline_executor<T, Comm>& px, std::span<Optimizer> opts) {
  if (opts.size() != px.chunks())
    throw config_error("pipeline checkpoint",
                       std::to_string(opts.size()) + " optimizers for " +
                           std::to_string(px.chunks()) + " chunks",
                       "give one optimizer per chunk");
  const program::pipeline_plan& plan = px.plan();
  const std::size_t world = plan.ranks(), first = plan.first_rank(px.device());
  // this rank's tensors, their boxes moved from the group's ranks to the world's
  std::vector<training_tensor<T>> mine;
  for (std::size_t c = 0; c < px.chunks(); ++c) {
    auto& dx = px.local(c);
    for (training_tensor<T>& t :
         training_tensors<T>(px.stage_graph(c).g, &dx.program(), dx.local(), opts[c])) {
      std::vector<box> boxes(world, box{std::vector<std::size_t>(t.shape.size(), 0),
                                        std::vector<std::size_t>(t.shape.size(), 0)});
      for (std::size_t r = 0; r < t.boxes.size(); ++r)
        boxes.at(first + r) = t.boxes[r];
      t.boxes = std::move(boxes);
      mine.push_back(std::move(t));
    }
  }
  // every tensor in the model's order on every rank (the writers are chosen by that order)
  std::vector<std::string> prefixes{""};
  if constexpr (requires { Optimizer::state_slots; })
    for (std::size_t k = 0; k < Optimizer::state_slots; ++k)
      prefixes.push_back("optimizer." + std::string(Optimizer::state_names[k]) + ".");
  std::vector<training_tensor<T>> out;
  const graph::graph& g = px.graph();
  for (const std::string& prefix : prefixes)
    for (graph::node_id p : g.parameters()) {
      const std::string name = prefix + g[p].name;
      bool held = false;
      for (const training_tensor<T>& t : mine)
        if (t.name == name) {
          out.push_back(t);
          held = true;
        }
      if (!held) {
        training_tensor<T> t;
        t.name = name;
        t.shape = g[p].out.dims;
        t.boxes.assign(world, box{std::vector<std::size_t>(t.shape.size(), 0),
                                  std::vector<std::size_t>(t.shape.size(), 0)});
        t.optimizer = !prefix.empty();
        out.push_back(std::move(t));
      }
    }
  return out;
}

} // namespace hspmd::train
