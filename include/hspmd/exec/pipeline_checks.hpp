#pragma once
// What every rank checks before a pipeline runs (exec/pipeline.hpp): that all hold the same
// model and pipeline plan -- mismatched schedules or micro-batch counts would leave groups
// waiting on each other -- and that the plan fits the job.

#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/exec/agreement.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/synth/plan.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// Collective over `world`: every rank holds the same micro-batch graph `g` and plan `p` (each
/// group then agrees on its stages' plans, exec/agreement.hpp) -- the first difference throws
/// `config_error` on every rank naming it -- and the plan has a stage plan per stage and a
/// device per rank.
template <class Comm>
void check_pipeline(const graph::graph& g, const program::pipeline_plan& p, Comm& world) {
  const auto list = [](const std::vector<std::size_t>& v) {
    std::string out;
    for (std::size_t x : v)
      out += (out.empty() ? "" : ",") + std::to_string(x);
    return out;
  };
  const std::array<std::pair<std::string, std::string>, 7> what = {{
      {"model (the micro-batch's traced graph)", to_hex(synth::graph_hash(g))},
      {"pipeline groups", list(p.group_sizes)},
      {"pipeline stages' first blocks", list(p.first_blocks)},
      {"pipeline schedule", std::string(program::name(p.schedule))},
      {"micro-batches", std::to_string(p.micro)},
      {"chunks per group", std::to_string(p.chunks)},
      {"pipeline plan (its stages' programs)", to_hex(p.hash())},
  }};
  // (first: a rank that threw alone below would leave the others waiting)
  agree_on_options(std::span<const std::pair<std::string, std::string>>(what), world);
  if (p.ranks() != static_cast<std::size_t>(world.size()))
    throw config_error("pipeline",
                       "the plan's groups hold " + std::to_string(p.ranks()) +
                           " devices and the job runs " + std::to_string(world.size()) + " ranks",
                       "run one rank per device of the plan");
  if (p.stages.size() != p.make().stages())
    throw config_error("pipeline",
                       std::to_string(p.stages.size()) + " stage plans for " +
                           std::to_string(p.make().stages()) + " stages",
                       "give one plan per stage");
  for (std::size_t k = 0; k < p.stages.size(); ++k)
    if (p.two_level_at(k) != nullptr)
      throw config_error("pipeline",
                         "stage " + std::to_string(k) +
                             " runs a two-level program (its nodes' own programs, the gradients "
                             "all-reduced across them), which the pipeline executor does not run "
                             "yet",
                         "plan with hspmd-plan --stage-programs one-level");
}

} // namespace hspmd::exec
