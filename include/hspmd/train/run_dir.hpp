#pragma once
// The trainer's side of the elastic launcher's run directory (HSPMD_RUN_DIR, set by hspmd-run):
// the launcher asks a running job to stop at a step boundary -- to take a device back, or let
// one go -- by creating the file `stop` there. Rank 0 looks for it after every step and tells
// every rank, so all stop after the same step; the trainer then saves that step (if it did not
// already) and returns, and the launcher starts the job again on the new devices with --resume.

#include <hspmd/train/namespace.hpp>
#include <hspmd/train/world.hpp>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace hspmd::train {

/// The launcher's run directory, when the job was started by hspmd-run.
[[nodiscard]] inline std::optional<std::filesystem::path> run_directory() {
  const char* d = std::getenv("HSPMD_RUN_DIR");
  if (d == nullptr || *d == '\0')
    return std::nullopt;
  return std::filesystem::path(d);
}

/// The file whose presence asks the job to stop after its current step.
[[nodiscard]] inline std::filesystem::path stop_request_file(const std::filesystem::path& dir) {
  return dir / "stop";
}

/// Whether the launcher asked the job to stop (rank 0's view, told to every rank). Collective.
[[nodiscard]] inline bool stop_requested(world& w, const std::filesystem::path& dir) {
  std::error_code ec;
  std::string flag = w.root() && std::filesystem::exists(stop_request_file(dir), ec) ? "1" : "";
  w.broadcast_text(flag);
  return !flag.empty();
}

} // namespace hspmd::train
