// Traces of a distributed run: every rank's events reach rank 0 as one Chrome/Perfetto trace
// with a track per rank, every compute step, every collective with its bytes, and idle gaps.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace hspmd;

TEST_CASE("a traced run gives rank 0 one trace: a track per rank, compute, collectives, idle") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  models::model_options o;
  o.layers = 1;
  o.hidden = 16;
  o.heads = 2;
  o.seq = 4;
  o.vocab = 24;
  const auto g = models::trace_model<float>("bert", o, 4);
  std::vector<double> speeds(n, 1e9);
  const cluster c = test::make_cluster(speeds, 1e6);
  const synth::plan p = synth::make_baseline(g, c, synth::baseline::tp, {}, "bert");
  exec::distributed_executor<float, mpi_communicator> dx(g, p, comm, 3);
  const std::vector<std::int64_t> tokens(4 * 4, 1);
  dx.set_input("tokens", std::span<const std::int64_t>(tokens));
  dx.set_input("targets", std::span<const std::int64_t>(tokens));
  CHECK(dx.trace().size() == 0);
  (void)dx.forward(); // not traced: recording starts with start_trace
  CHECK(dx.trace().size() == 0);
  dx.start_trace();
  exec::sgd opt(0.1);
  constexpr int steps = 2;
  for (int s = 0; s < steps; ++s) {
    (void)dx.forward();
    dx.backward();
    (void)dx.clip_grad_norm(1.0);
    dx.update(opt);
  }
  std::vector<std::string> names;
  for (std::size_t r = 0; r < n; ++r)
    names.push_back("dev" + std::to_string(r));
  const nlohmann::json t = dx.collect_trace(names);
  if (comm.rank() != 0) {
    CHECK(t.empty());
    return;
  }
  REQUIRE(t.contains("traceEvents"));
  std::map<int, std::vector<nlohmann::json>> work; // per rank: X events on the work thread
  std::set<std::string> processes;
  std::size_t compute = 0;
  std::size_t collectives = 0;
  std::size_t idle = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M") {
      if (e["name"] == "process_name")
        processes.insert(e["args"]["name"].get<std::string>());
      continue;
    }
    REQUIRE(e["ph"] == "X");
    CHECK(e["ts"].get<double>() >= 0.0);
    CHECK(e["dur"].get<double>() >= 0.0);
    const int pid = e["pid"].get<int>();
    CHECK(pid >= 0);
    CHECK(pid < static_cast<int>(n));
    work[pid].push_back(e);
    if (e["cat"] == "compute")
      ++compute;
    else if (e["cat"] == "idle")
      ++idle;
    else if (e["cat"] == "comm") {
      ++collectives;
      CHECK(e["args"].contains("bytes"));
      if (e["name"].get<std::string>().rfind("all_gather", 0) == 0 ||
          e["name"].get<std::string>().rfind("reduce_scatter", 0) == 0)
        CHECK(e["args"].contains("algorithm"));
    }
  }
  CHECK(processes.size() == n);
  CHECK(processes.count("rank 0 (dev0)") == 1);
  CHECK(work.size() == n);
  // Every rank ran every computed node of its program forward and backward in each step, plus
  // the optimizer (inputs, parameters and transfers are not compute).
  std::size_t computed = 0;
  for (graph::node_id i = 0; i < dx.program().local.size(); ++i) {
    const auto k = dx.program().local[i].kind;
    if (k != graph::op::input && k != graph::op::parameter && !dx.program().transfer_of[i])
      ++computed;
  }
  CHECK(compute >= n * steps * (2 * computed + 1));
  // The loss and the gradient norm are all-reduced every step; TP moves activations too.
  CHECK(collectives >= n * steps * 2 + (n > 1 ? n * steps : 0));
  // On each rank the work events (compute, collectives, idle: the work track) never overlap.
  for (auto& [rank, events] : work) {
    std::erase_if(events, [](const nlohmann::json& e) { return e["tid"] != 0; });
    std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
      return a["ts"].template get<double>() < b["ts"].template get<double>();
    });
    for (std::size_t k = 1; k < events.size(); ++k) {
      const double end = events[k - 1]["ts"].get<double>() + events[k - 1]["dur"].get<double>();
      CHECK(events[k]["ts"].get<double>() >= end - 1e-3);
    }
  }
  (void)idle; // gaps depend on timing: counted, not asserted
}

TEST_CASE("gradient buckets all-reduce during the backward: in flight while later layers compute") {
  mpi_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  models::model_options o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 2;
  o.seq = 4;
  o.vocab = 24;
  const auto g = models::trace_model<float>("bert", o, 4);
  const cluster c = test::make_cluster(std::vector<double>(n, 1e9), 1e6);
  const synth::plan p = synth::make_baseline(g, c, synth::baseline::dp_ev, {}, "bert");
  exec::distributed_executor<float, mpi_communicator> dx(g, p, comm, 3);
  dx.set_bucket_bytes(4096);
  const auto buckets = dx.gradient_buckets();
  if (n == 1) {
    CHECK(buckets.empty()); // nothing to synchronize
    return;
  }
  REQUIRE(buckets.size() >= 3);
  // Started in the order the backward completes them: the first holds the head's gradients (the
  // last layer), the last the embedding's.
  const auto names_of = [&](const std::vector<graph::node_id>& b) {
    std::string s;
    for (graph::node_id id : b)
      s += g[dx.program().global[id]].name + " ";
    return s;
  };
  CAPTURE(names_of(buckets.front()), names_of(buckets.back()));
  CHECK(names_of(buckets.front()).find("head") != std::string::npos);
  CHECK(names_of(buckets.back()).find("tok") != std::string::npos);
  const std::vector<std::int64_t> tokens(4 * 4, 1);
  dx.set_input("tokens", std::span<const std::int64_t>(tokens));
  dx.set_input("targets", std::span<const std::int64_t>(tokens));
  dx.start_trace();
  exec::adam opt(1e-3);
  for (int s = 0; s < 2; ++s) {
    (void)dx.forward();
    dx.backward();
    dx.update(opt, exec::clip_scale(std::sqrt(dx.grad_norm_squared()), 1.0));
  }
  const nlohmann::json t = dx.collect_trace();
  if (comm.rank() != 0)
    return;
  // Per rank: the in-flight all-reduces (track 2) and the backward's compute spans (track 0).
  std::map<int, std::vector<std::pair<double, double>>> in_flight;
  std::map<int, double> last_backward; // the latest start of a backward compute span
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X")
      continue;
    const int pid = e["pid"].get<int>();
    const double ts = e["ts"].get<double>();
    if (e["tid"] == 2) {
      CHECK(e["name"] == "all_reduce gradients");
      CHECK(e["args"].contains("bytes"));
      in_flight[pid].emplace_back(ts, ts + e["dur"].get<double>());
    } else if (e["tid"] == 0 && e["cat"] == "compute" && e.contains("args") &&
               e["args"].value("pass", "") == "backward")
      last_backward[pid] = std::max(last_backward[pid], ts);
  }
  CHECK(in_flight.size() == n);
  for (const auto& [rank, spans] : in_flight) {
    INFO("rank " << rank);
    CHECK(spans.size() == 2 * buckets.size()); // every bucket, both steps
    // The first bucket starts while the backward still has nodes to run.
    const double first = std::min_element(spans.begin(), spans.end())->first;
    CHECK(first < last_backward[rank]);
  }
}
