#pragma once
// Traces in the Chrome / Perfetto trace-event format (open in ui.perfetto.dev or
// chrome://tracing), measured or simulated: one process per rank ("rank R (device)"), a thread
// for its work (compute per node, forward and backward, emulated slowdown included; collectives
// with kind, tensor, bytes, algorithm; the optimizer step), one for the steps and one for
// collectives in flight; the gaps between work events become "idle" events when the trace is
// written. The distributed executor records spans as they run (`span`, `add`) and
// `distributed_executor::collect_trace` gathers every rank's events to rank 0; the simulator
// (sim/step.hpp) records the spans it predicts (`add_at`), so a measured and a simulated step
// open side by side.
//
// Times are microseconds since the recorder started (ranks start together after a barrier).
// A collective's span includes the time spent waiting for the slowest peer.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::sim {

/// What a traced span was.
/// compute and communication: the rank's work (one track, nested); step: the trainer's step spans
/// (a track of their own); in_flight: a non-blocking collective from its start to its
/// completion, while the rank works on (a third track, not counted as work).
enum class trace_kind : std::uint8_t { compute, communication, step, in_flight };

/// Records spans of one rank.
class trace_recorder {
public:
  using clock = std::chrono::steady_clock;

  /// Starts recording now (clears earlier events).
  void start() {
    events_.clear();
    epoch_ = clock::now();
    on_ = true;
  }
  void stop() noexcept { on_ = false; }
  [[nodiscard]] bool on() const noexcept { return on_; }
  [[nodiscard]] std::size_t size() const noexcept { return events_.size(); }

  /// Records `[begin, end)` as one event with `args` (a JSON object).
  void add(std::string name, trace_kind kind, clock::time_point begin, clock::time_point end,
           nlohmann::json args = nlohmann::json::object()) {
    if (!on_)
      return;
    events_.push_back(
        {std::move(name), kind, micros(begin), micros(end) - micros(begin), std::move(args)});
  }
  /// Records an event at given times (microseconds since the start), recording or not: what a
  /// simulated timeline holds.
  void add_at(std::string name, trace_kind kind, double start_us, double duration_us,
              nlohmann::json args = nlohmann::json::object()) {
    events_.push_back({std::move(name), kind, start_us, duration_us, std::move(args)});
  }
  /// Runs `f` and records it when recording.
  template <class F>
  void span(std::string_view name, trace_kind kind, const nlohmann::json& args, F&& f) {
    if (!on_) {
      f();
      return;
    }
    const auto begin = clock::now();
    f();
    add(std::string(name), kind, begin, clock::now(), args);
  }

  /// This rank's events as trace-event JSON: metadata naming the process "rank R (device)",
  /// the recorded events, and an "idle" event for every gap of at least `min_idle_us` between
  /// consecutive work events.
  [[nodiscard]] nlohmann::json events_json(int rank, std::string_view device,
                                           double min_idle_us = 1.0) const {
    nlohmann::json out = nlohmann::json::array();
    const auto meta = [&](const char* what, int tid, const std::string& value) {
      out.push_back(
          {{"ph", "M"}, {"name", what}, {"pid", rank}, {"tid", tid}, {"args", {{"name", value}}}});
    };
    meta("process_name", 0, "rank " + std::to_string(rank) + " (" + std::string(device) + ")");
    out.back()["args"]["sort_index"] = rank;
    meta("thread_name", 0, "work");
    meta("thread_name", 1, "steps");
    meta("thread_name", 2, "collectives in flight");
    std::vector<const event*> work;
    for (const event& e : events_)
      if (e.kind != trace_kind::step && e.kind != trace_kind::in_flight)
        work.push_back(&e);
    std::ranges::stable_sort(work, {}, &event::start);
    double busy_until = work.empty() ? 0.0 : work.front()->start;
    for (const event* e : work) {
      if (e->start - busy_until >= min_idle_us)
        out.push_back(item("idle", "idle", busy_until, e->start - busy_until, rank, 0, {}));
      busy_until = std::max(busy_until, e->start + e->duration);
    }
    for (const event& e : events_)
      out.push_back(item(e.name, category(e.kind), e.start, e.duration, rank,
                         e.kind == trace_kind::step        ? 1
                         : e.kind == trace_kind::in_flight ? 2
                                                           : 0,
                         e.args));
    return out;
  }

private:
  struct event {
    std::string name;
    trace_kind kind;
    double start;
    double duration;
    nlohmann::json args;
  };
  [[nodiscard]] double micros(clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - epoch_).count();
  }
  static const char* category(trace_kind k) {
    return k == trace_kind::compute ? "compute" : k == trace_kind::step ? "step" : "comm";
  }
  static nlohmann::json item(const std::string& name, const char* cat, double ts, double dur,
                             int pid, int tid, const nlohmann::json& args) {
    nlohmann::json j = {{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", ts},
                        {"dur", dur},   {"pid", pid}, {"tid", tid}};
    if (!args.empty())
      j["args"] = args;
    return j;
  }

  std::vector<event> events_;
  clock::time_point epoch_ = clock::now();
  bool on_ = false;
};

/// A whole trace file from every rank's `events_json`.
[[nodiscard]] inline nlohmann::json chrome_trace(const std::vector<nlohmann::json>& ranks,
                                                 nlohmann::json metadata = {}) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& r : ranks)
    for (const auto& e : r)
      events.push_back(e);
  nlohmann::json j = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  if (!metadata.is_null())
    j["otherData"] = std::move(metadata);
  return j;
}

} // namespace hspmd::sim
