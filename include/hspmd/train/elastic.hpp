#pragma once
// The hardware-free half of the elastic launcher (tools/run.cpp, `hspmd-run`): reading a failed
// job's output for the ranks it lost, the cluster that remains, and the records a membership
// change leaves in the metrics file. No processes here: the tool forks, watches and relaunches.
//
// Which ranks a failure lost, from the lines the job printed (`attribute`), strongest first:
// - a rank's own fault line ("[hspmd rank R] HSPMD_FAULT: kill at step 57"), Open MPI's line
//   for a rank ended by a signal ("... noticed that process rank R with PID P on node H exited
//   on signal 9"), and the watchdog's "not arrived: rank R" (the others waited for it);
// - else Open MPI's first rank that exited non-zero ("Process name: [[J,1],R]" then "Exit
//   code"), a rank that called MPI_Abort, or a rank's own error line ("[hspmd rank R] ...").
// Watchdog lines name the *waiting* rank in their prefix: that rank is alive, not lost.

#include <hspmd/cluster/changes.hpp>
#include <hspmd/cluster/cluster.hpp>
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/train/namespace.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::train {

/// The ranks a failed job lost, each with its cause ("killed by signal 9", "HSPMD_FAULT: kill at
/// step 3", "did not arrive at a collective", "exited with status 1").
struct lost_ranks {
  std::map<int, std::string> ranks;
  bool definite = false; ///< from a fault, a signal or the watchdog (else from exits or errors)
};

/// Reads the ranks a job lost from its output lines (see the file comment).
[[nodiscard]] inline lost_ranks attribute(const std::vector<std::string>& lines) {
  static const std::regex fault(R"(^\[hspmd rank (\d+)\] HSPMD_FAULT: (.*)$)");
  static const std::regex signal(R"(noticed that process rank (\d+) with PID \S+ on node \S+ )"
                                 R"(exited on signal (\d+))");
  static const std::regex waited(R"(^\[hspmd rank \d+\] .* has not completed after .*)"
                                 R"(not arrived: (?:world )?ranks? ([0-9, ]+))");
  static const std::regex process(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
  static const std::regex exit_code(R"(Exit code:\s+(\d+))");
  static const std::regex aborted(R"(MPI_ABORT was invoked on rank (\d+))");
  static const std::regex error(R"(^\[hspmd rank (\d+)\] (.*)$)");
  lost_ranks definite;
  lost_ranks other;
  std::optional<int> exited; // "Process name" seen, its exit code next
  for (const std::string& line : lines) {
    std::smatch m;
    if (std::regex_search(line, m, fault)) {
      definite.ranks.emplace(std::stoi(m[1]), "HSPMD_FAULT: " + m[2].str());
    } else if (std::regex_search(line, m, signal)) {
      definite.ranks.emplace(std::stoi(m[1]), "killed by signal " + m[2].str());
    } else if (std::regex_search(line, m, waited)) {
      const std::string list = m[1];
      static const std::regex number(R"(\d+)");
      for (auto it = std::sregex_iterator(list.begin(), list.end(), number);
           it != std::sregex_iterator(); ++it)
        definite.ranks.emplace(std::stoi(it->str()),
                               "did not arrive at a collective (the others' watchdog)");
    } else if (std::regex_search(line, m, process)) {
      exited = std::stoi(m[1]);
    } else if (exited && std::regex_search(line, m, exit_code)) {
      other.ranks.emplace(*exited, "exited with status " + m[1].str());
      exited.reset();
    } else if (std::regex_search(line, m, aborted)) {
      other.ranks.emplace(std::stoi(m[1]), "called MPI_Abort");
    } else if (line.find("has not completed after") == std::string::npos &&
               std::regex_search(line, m, error)) {
      other.ranks.emplace(std::stoi(m[1]), m[2].str());
    }
  }
  if (!definite.ranks.empty()) {
    definite.definite = true;
    return definite;
  }
  return other;
}

/// The cluster without the devices of `lost` ranks (device i is rank i), named for generation
/// `generation`; measured collective costs are dropped (they were measured at another rank
/// count). Throws config_error when no device would remain or a rank is out of range.
[[nodiscard]] inline cluster remaining_cluster(const cluster& c, const std::vector<int>& lost,
                                               std::size_t generation, const std::string& base) {
  cluster out = c;
  std::vector<std::string> names;
  for (int r : lost) {
    if (r < 0 || static_cast<std::size_t>(r) >= c.size())
      throw config_error("lost rank " + std::to_string(r),
                         "is not a rank of the job's " + std::to_string(c.size()) + " devices",
                         "check the job's output");
    names.push_back(c.devices[static_cast<std::size_t>(r)].name);
  }
  for (const std::string& name : names)
    out = apply(out, parse_change("remove " + name));
  out.collective_costs.clear();
  out.name = base + "-gen" + std::to_string(generation);
  out.description = "what remains of " + base + " at generation " + std::to_string(generation);
  return out;
}

/// "cpu0, cpu2"
[[nodiscard]] inline std::string device_list(const cluster& c) {
  std::string s;
  for (const device_spec& d : c.devices)
    s += (s.empty() ? "" : ", ") + d.name;
  return s;
}

/// The last step a metrics file records, read on from where the last look ended (a launcher
/// looks every 0.1 s: a long run's file is not read again each time). A file that shrank (a new
/// run's) is read from its start.
class step_follower {
public:
  explicit step_follower(std::string metrics) : path_(std::move(metrics)) {}
  [[nodiscard]] std::size_t operator()() {
    std::ifstream in(path_, std::ios::binary);
    if (!in)
      return step_;
    in.seekg(0, std::ios::end);
    const auto size = static_cast<std::uint64_t>(in.tellg());
    if (size < offset_)
      offset_ = 0, step_ = 0;
    in.seekg(static_cast<std::streamoff>(offset_));
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) // a line still being written: read it whole next time
        break;
      offset_ += line.size() + 1;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_unsigned())
        step_ = j["step"].get<std::size_t>();
    }
    return step_;
  }

private:
  std::string path_;
  std::uint64_t offset_ = 0;
  std::size_t step_ = 0;
};

/// The last step a metrics file records (0 when none); "" or an unreadable file: 0.
[[nodiscard]] inline std::size_t last_step(const std::string& metrics) {
  return step_follower(metrics)();
}

} // namespace hspmd::train
