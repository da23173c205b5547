#pragma once
// The start of a pipeline run of the library trainer (`train_options::pipeline`, from
// train/distributed_start.hpp): rank 0 makes the pipeline plan (program/pipeline_plan.hpp) --
// the groups from --pipeline, the schedule, m = --accumulate, each stage's strategy from --plan
// -- or reads a pipeline plan file given as --plan, and every rank takes rank 0's plan; then
// the rank's engine (train/pipeline_engine.hpp) over it. Every rank checks the plan against
// the others' before any stage is built (exec::pipeline_executor).

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/io/json_input.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/pipeline_engine.hpp>
#include <hspmd/train/report.hpp>
#include <hspmd/train/run_plan.hpp>
#include <hspmd/train/train_options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

namespace hspmd::train {

/// The devices of each pipeline group from `--pipeline` text (see train_options::pipeline) for
/// `ranks` ranks; throws `config_error` naming the text and the fix.
[[nodiscard]] inline std::vector<std::size_t> pipeline_groups(const std::string& text,
                                                              std::size_t ranks) {
  return program::parse_group_sizes("--pipeline", text, ranks, true);
}

/// Rank 0's pipeline plan on every rank (collective), see the file comment.
[[nodiscard]] inline program::pipeline_plan pipeline_plan_for(const graph::graph& g,
                                                              const train_options& o,
                                                              const cluster& c,
                                                              mpi_communicator& comm) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  const std::vector<std::size_t> groups = pipeline_groups(o.pipeline, ranks); // (every rank)
  std::string text;
  std::string failure; // rank 0's, told to every rank
  std::exception_ptr error;
  if (comm.rank() == 0) {
    try {
      const bool named = o.plan.empty() || o.plan == "synth" || o.plan == "dp-ev" ||
                         o.plan == "dp-cp" || o.plan == "tp";
      program::pipeline_plan p;
      if (named) {
        program::pipeline_options po;
        po.group_sizes = groups;
        po.schedule = program::parse_schedule(o.pipeline_schedule);
        po.micro = o.accumulate;
        po.chunks = o.pipeline_chunks;
        po.strategy = o.plan.empty() ? "synth" : o.plan;
        po.model = o.name;
        if (o.recompute) // each stage planned with it: its replays priced, its memory counted
          po.synth.search.recompute = synth::search_options::recomputation::always;
        p = program::make_pipeline_plan(g, c, po);
      } else {
        p = program::pipeline_plan_from_json(nlohmann::json::parse(io::read_text_file(o.plan)), g,
                                             o.plan);
        if (p.group_sizes != groups)
          throw config_error("plan " + o.plan,
                             "has other pipeline groups than --pipeline " + o.pipeline,
                             "give --pipeline the plan's groups");
        if (p.micro != o.accumulate)
          throw config_error("plan " + o.plan,
                             "runs " + std::to_string(p.micro) +
                                 " micro-batches a step and "
                                 "--accumulate is " +
                                 std::to_string(o.accumulate),
                             "give --accumulate " + std::to_string(p.micro));
        if (o.recompute) // a stage plan made without it: priced with it
          program::recompute_stages(p, g, c);
        program::check_memory(p, g, c); // (a plan made here was checked when made)
      }
      text = program::to_json(p).dump();
    } catch (const std::exception& e) {
      failure = e.what();
      error = std::current_exception();
    }
  }
  const auto share = [&](std::string& s) {
    auto size = static_cast<std::uint64_t>(s.size());
    comm.broadcast(std::span<std::uint64_t>(&size, 1), 0);
    s.resize(static_cast<std::size_t>(size));
    comm.broadcast(std::span<char>(s), 0);
  };
  share(failure);
  if (error)
    std::rethrow_exception(error);
  if (!failure.empty())
    throw config_error("the pipeline plan (made on rank 0)", failure, "as rank 0 says");
  share(text);
  return program::pipeline_plan_from_json(nlohmann::json::parse(text), g, "rank 0's plan");
}

/// This rank's engine of a pipeline run (collective); prints the plan on `out` (rank 0's).
template <std::floating_point T, class Optimizer>
[[nodiscard]] std::unique_ptr<engine<T, Optimizer>>
start_pipeline(const graph::graph& g, const train_options& o, const cluster& c,
               mpi_communicator& comm, std::ostream* out) {
  const program::pipeline_plan plan = pipeline_plan_for(g, o, c, comm);
  if (comm.rank() == 0 && !o.save_plan.empty())
    write_file(o.save_plan, program::to_json(plan).dump(1));
  if (out != nullptr) {
    const program::pipeline_timeline t =
        program::simulate(plan.make(), program::predicted_costs(plan, g, c));
    print(*out,
          "pipeline: %zu stages on %zu groups, %s, %zu micro-batches a step; predicted step %s, "
          "bubble %.1f%%\n",
          plan.stages.size(), plan.group_sizes.size(),
          std::string(program::name(plan.schedule)).c_str(), plan.micro,
          synth::milliseconds_text(t.step).c_str(), 100.0 * t.bubble);
    if (o.explain)
      *out << program::explain(plan, g, c);
  }
  auto e = std::make_unique<pipeline_engine<T, Optimizer, mpi_communicator>>(g, plan, comm, o.seed);
  // an emulated device computes as much slower as the cluster says (exec/emulation.hpp)
  e->pipeline().set_slowdown(c.devices.at(static_cast<std::size_t>(comm.rank())).slowdown);
  e->set_device_names(trace_device_names(c));
  return e;
}

} // namespace hspmd::train
