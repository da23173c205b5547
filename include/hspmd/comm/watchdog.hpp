#pragma once
// The watchdog of blocking communication (HSPMD_TIMEOUT).
//
// A rank that stops, hangs, dies without its launcher noticing, or calls other collectives than
// its peers leaves them waiting inside MPI forever, and a blocking MPI call cannot be
// interrupted. So a communicator tells its watchdog what it is about to wait for (`watch`), and
// a thread of the watchdog, which never calls MPI, checks the clock: a wait that has not ended
// within the timeout prints one line naming the rank, the call with its sequence number, the
// phase (e.g. "training step 5"), the last call that completed on this rank and how long it has
// waited, and then ends the process with exit status 1, which makes mpirun end every rank.
// Every waiting rank reports its own wait; a rank that reports none has not arrived (it
// stopped, hangs, failed or runs other collectives). The thread waits about a second between
// printing and ending, so that ranks which began waiting at about the same time report too.
//
// Costs on the caller's thread: a mutex and a clock read before and after each blocking call.
// With a timeout of 0 there is no thread and `watch` does nothing.

#include <hspmd/comm/debug.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace hspmd {

/// The library trainer's timeout when HSPMD_TIMEOUT is not set (seconds).
inline constexpr double default_training_timeout = 300.0;
/// The largest accepted timeout (seconds, about 11.6 days).
inline constexpr double max_timeout = 1e6;

/// Parses a timeout: "0" or "off" -> 0 (no limit); else seconds in (0, max_timeout], written as
/// a number with an optional trailing "s". Throws `config_error` naming `where` otherwise.
[[nodiscard]] inline double parse_timeout(std::string_view text, std::string_view where) {
  const std::string s(text);
  if (s == "off")
    return 0.0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const bool number = end != s.c_str() && (*end == '\0' || (*end == 's' && end[1] == '\0'));
  if (!number || !(v >= 0.0) || v > max_timeout)
    throw config_error(std::string(where), "\"" + s + "\" is not a timeout",
                       "give seconds between 0 and 1e6, e.g. 300; 0 or off for no limit");
  return v;
}

/// Seconds from the environment variable HSPMD_TIMEOUT (`parse_timeout`); `fallback` when it is
/// unset or empty.
[[nodiscard]] inline double timeout_from_env(double fallback = 0.0) {
  const char* v = std::getenv("HSPMD_TIMEOUT");
  if (v == nullptr || *v == '\0')
    return fallback;
  return parse_timeout(v, "environment variable HSPMD_TIMEOUT");
}

/// What a communicator waits for: a collective (its fingerprint), or a point-to-point message.
struct pending_call {
  call_fingerprint call;
  const char* point_to_point = nullptr; ///< "send to" / "receive from", or nullptr: `call`
  int peer = -1;
  int tag = 0;
};

/// "all_reduce #57 (f32, 4096 elements, sum)", "receive from rank 2 (tag 7)".
[[nodiscard]] inline std::string describe(const pending_call& p) {
  if (p.point_to_point == nullptr)
    return describe(p.call);
  return std::string(p.point_to_point) + " rank " + std::to_string(p.peer) + " (tag " +
         std::to_string(p.tag) + ")";
}

/// Bounds a rank's blocking waits (see the file comment). Not copyable or movable: own it by
/// pointer where the owner moves.
class collective_watchdog {
public:
  using clock = std::chrono::steady_clock;

  /// `rank` names the process in the report; `seconds` 0 disables it.
  collective_watchdog(int rank, double seconds) : rank_(rank) { set_timeout(seconds); }
  collective_watchdog(const collective_watchdog&) = delete;
  collective_watchdog& operator=(const collective_watchdog&) = delete;
  collective_watchdog(collective_watchdog&&) = delete;
  collective_watchdog& operator=(collective_watchdog&&) = delete;
  ~collective_watchdog() { stop(); }

  /// The limit in seconds (0: none).
  [[nodiscard]] double timeout() const {
    const std::scoped_lock lock(mutex_);
    return timeout_;
  }
  /// Changes the limit; 0 stops the thread. Call between waits, from the waiting thread.
  void set_timeout(double seconds) {
    stop();
    const std::scoped_lock lock(mutex_);
    timeout_ = seconds;
    if (seconds > 0.0) {
      quit_ = false;
      thread_ = std::thread([this] { run(); });
    }
  }

  /// What the rank is doing, for the report ("training step 5"); empty: nothing said.
  void set_phase(std::string phase) {
    const std::scoped_lock lock(mutex_);
    phase_ = std::move(phase);
  }

  /// Ends a watched wait (see `watch`).
  class scope {
  public:
    explicit scope(collective_watchdog* w) noexcept : w_(w) {}
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    scope(scope&&) = delete;
    scope& operator=(scope&&) = delete;
    ~scope() {
      if (w_ != nullptr)
        w_->end();
    }

  private:
    collective_watchdog* w_;
  };

  /// Marks the start of a blocking wait for `p`; the returned scope marks its end.
  [[nodiscard]] scope watch(const pending_call& p) {
    if (!thread_.joinable())
      return scope(nullptr);
    const std::scoped_lock lock(mutex_);
    current_ = p;
    since_ = clock::now();
    waiting_ = true;
    return scope(this);
  }

  /// The report for the current wait as if it had timed out now (empty when not waiting).
  [[nodiscard]] std::string report() const {
    const std::scoped_lock lock(mutex_);
    return waiting_ ? "rank " + std::to_string(rank_) + ": " + report_locked(clock::now())
                    : std::string();
  }

private:
  void end() {
    const std::scoped_lock lock(mutex_);
    waiting_ = false;
    last_ = current_;
    has_last_ = true;
  }

  void stop() {
    {
      const std::scoped_lock lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable())
      thread_.join();
  }

  [[nodiscard]] std::string report_locked(clock::time_point now) const {
    const double waited = std::chrono::duration<double>(now - since_).count();
    char seconds[64];
    std::snprintf(seconds, sizeof seconds, "%.1f s (HSPMD_TIMEOUT=%g)", waited, timeout_);
    std::string s = describe(current_);
    if (!phase_.empty())
      s += " in " + phase_;
    s += " has not completed after " + std::string(seconds) +
         "; the last call completed here: " + (has_last_ ? describe(last_) : std::string("none")) +
         " (a rank that does not report this wait has not arrived: it stopped, hangs, failed or "
         "runs other collectives; HSPMD_DEBUG=detail compares every call; raise HSPMD_TIMEOUT "
         "if a step legitimately takes longer)";
    return s;
  }

  void run() {
    std::unique_lock lock(mutex_);
    const auto period = std::chrono::duration_cast<clock::duration>(
        std::chrono::duration<double>(std::min(0.25, timeout_ / 4.0)));
    while (!quit_) {
      wake_.wait_for(lock, period);
      if (quit_ || !waiting_)
        continue;
      const auto now = clock::now();
      if (std::chrono::duration<double>(now - since_).count() < timeout_)
        continue;
      const std::string line = "[hspmd rank " + std::to_string(rank_) + "] " + report_locked(now);
      lock.unlock();
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::seconds(1)); // let peers report their waits
      std::_Exit(1);
    }
  }

  int rank_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  double timeout_ = 0.0;
  bool quit_ = false;
  bool waiting_ = false;
  bool has_last_ = false;
  pending_call current_;
  pending_call last_;
  clock::time_point since_;
  std::string phase_;
};

} // namespace hspmd
