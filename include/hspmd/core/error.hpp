#pragma once
// The exceptions hspmd throws. Every message is one line of the form
//     WHERE: WHAT (FIX)
// e.g. "clusters/a.json: field devices[1].speed: must be positive (expected flop/s > 0,
// e.g. 1.4e13)" so that a user sees the file/field or rank, the cause, and what to change, without
// a backtrace.

#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace hspmd {

/// Base of every exception hspmd throws: `what()` is "where: reason (fix)" on one line.
class error : public std::runtime_error {
public:
  /// `where` names the file/field, rank or call; `reason` the cause; `fix` what to do (may be
  /// empty when there is nothing a user can change).
  error(std::string where, std::string reason, std::string fix = {})
      : std::runtime_error(compose(where, reason, fix)), where_(std::move(where)),
        reason_(std::move(reason)), fix_(std::move(fix)) {}

  /// The place: "FILE: field PATH", "rank 2: MPI_Allgatherv", a function name, ...
  [[nodiscard]] const std::string& where() const noexcept { return where_; }
  /// The cause, without the place or the fix.
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }
  /// How to fix it; empty when the message has no fix.
  [[nodiscard]] const std::string& fix() const noexcept { return fix_; }

private:
  static std::string compose(const std::string& where, const std::string& reason,
                             const std::string& fix) {
    std::string line = where.empty() ? reason : where + ": " + reason;
    if (!fix.empty())
      line += " (" + fix + ")";
    // One line, always: a newline inside a field would break "one error, one line".
    for (char& c : line)
      if (c == '\n' || c == '\r')
        c = ' ';
    return line;
  }

  std::string where_;
  std::string reason_;
  std::string fix_;
};

/// Bad user input: a cluster file, a plan file, a flag. `where` is "FILE: field PATH".
class config_error : public error {
public:
  using error::error;
};

/// A runtime extent does not fit an op (static mismatches are compile errors instead).
class shape_error : public error {
public:
  using error::error;
};

/// A communication call failed. Carries the rank that saw the failure.
class comm_error : public error {
public:
  /// `call` is the failing operation, e.g. "MPI_Allgatherv"; `where()` becomes "rank R: call".
  comm_error(int rank, const std::string& call, std::string reason, std::string fix = {})
      : error("rank " + std::to_string(rank) + ": " + call, std::move(reason), std::move(fix)),
        rank_(rank) {}

  /// The rank on which the failure was observed.
  [[nodiscard]] int rank() const noexcept { return rank_; }

private:
  int rank_;
};

/// A device (GPU) call failed or device memory ran out. Carries the device index.
class device_error : public error {
public:
  /// `call` is the failing operation, e.g. "cublasGemmEx"; `where()` becomes "device D: call".
  device_error(int device, const std::string& call, std::string reason, std::string fix = {})
      : error("device " + std::to_string(device) + ": " + call, std::move(reason), std::move(fix)),
        device_(device), call_(call) {}

  /// The device on which the failure was observed.
  [[nodiscard]] int device() const noexcept { return device_; }
  /// The failing operation.
  [[nodiscard]] const std::string& call() const noexcept { return call_; }

private:
  int device_;
  std::string call_;
};

/// A plan cannot be built or used: invalid ratios, infeasible memory, a plan for another cluster.
class plan_error : public error {
public:
  using error::error;
};

/// The one line a program prints for exception `e`: its what(), and for an allocation that
/// failed (whose what() is a bare "std::bad_alloc") what happened and the fix.
[[nodiscard]] inline std::string error_line(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr)
    return std::string("out of memory: an allocation failed (") + e.what() +
           ") (give a smaller batch or model, or run where there is more memory)";
  return e.what();
}

} // namespace hspmd
