#pragma once
// The trainer's metrics file (--metrics): one JSON object a line, written by rank 0 and flushed
// line by line, so a run that crashes keeps every line up to its last completed step.
//   {"event":"start", ...}  when the run starts training (after any resume): its ranks, the step
//                            it resumed from, the launcher's generation (HSPMD_RUN_GENERATION)
//   {"step":N, ...}          a step (train/report.hpp step_metrics)
//   {"eval_after_step":N,..} an evaluation
//   {"rebalance":{...}}      a re-balancing (train/run_plan.hpp)
// Every line carries "t", the wall-clock time (Unix seconds) it was written at. A run that
// resumes appends to the file (a relaunched job keeps its history: a step written twice is the
// later line that counts); a run that starts afresh begins a new file.

#include <hspmd/core/error.hpp>
#include <hspmd/train/namespace.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

namespace hspmd::train {

/// Seconds since the Unix epoch, with sub-second digits.
[[nodiscard]] inline double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

/// The launcher's generation of this job (hspmd-run sets HSPMD_RUN_GENERATION), if launched so.
[[nodiscard]] inline std::optional<long> run_generation() {
  const char* g = std::getenv("HSPMD_RUN_GENERATION");
  if (g == nullptr || *g == '\0')
    return std::nullopt;
  char* end = nullptr;
  const long v = std::strtol(g, &end, 10);
  if (*end != '\0' || v < 0)
    return std::nullopt;
  return v;
}

/// The metrics file of one run (rank 0's; closed on the other ranks: every call is then a no-op).
class metrics_log {
public:
  metrics_log() = default;

  /// Opens `path` (nothing when empty): appending when `resume`, else a new file.
  void open(const std::string& path, bool resume) {
    if (path.empty())
      return;
    file_.open(path, resume ? std::ios::app : std::ios::trunc);
    if (!file_)
      throw config_error(path, "cannot be written",
                         "give a path in an existing, writable directory");
  }

  [[nodiscard]] bool is_open() const { return file_.is_open(); }

  /// Writes one line, with "t" added, and flushes it.
  void write(nlohmann::json j) {
    if (!file_.is_open())
      return;
    j["t"] = unix_seconds();
    file_ << j.dump() << "\n" << std::flush;
  }

  /// The start record: `ranks` training, resumed from step `resumed_from` (loaded in `load_ms`),
  /// planned in `plan_ms` (a distributed run).
  void start(std::size_t ranks, std::size_t steps, std::optional<std::size_t> resumed_from,
             double load_ms, double plan_ms = 0.0) {
    nlohmann::json j{{"event", "start"}, {"ranks", ranks}, {"steps", steps}};
    if (plan_ms > 0.0)
      j["plan_ms"] = plan_ms;
    j["resumed_from"] = resumed_from ? nlohmann::json(*resumed_from) : nlohmann::json(nullptr);
    if (resumed_from)
      j["load_ms"] = load_ms;
    if (const auto g = run_generation())
      j["generation"] = *g;
    write(std::move(j));
  }

private:
  std::ofstream file_;
};

} // namespace hspmd::train
