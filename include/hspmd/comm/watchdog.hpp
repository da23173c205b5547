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
// Naming who has not arrived: a collective's wait that lasts half the timeout leaves a marker
// file (`wait_markers`: HSPMD_RUN_DIR/waits, else a folder of the MPI job in /dev/shm or the
// temporary directory) named by the communicator's members and the call's sequence number. At
// the timeout a rank gives its peers up to a second more to leave theirs, then names the members
// without one: "not arrived: rank 1". Only ranks of this host are checked (each process leaves
// a host marker when it starts); the line says how many ranks of other hosts were not.
//
// Costs on the caller's thread: a mutex and a clock read before and after each blocking call.
// With a timeout of 0 there is no thread and `watch` does nothing.

#include <hspmd/comm/debug.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>

#include <hspmd/core/hash.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

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

/// Where waits leave markers (see the file comment): HSPMD_RUN_DIR/waits when hspmd-run (or the
/// user) names a run directory, else a folder of this MPI job in /dev/shm (or the temporary
/// directory); empty outside a job that names itself (no markers, nobody named).
[[nodiscard]] inline std::filesystem::path wait_markers() {
  if (const char* d = std::getenv("HSPMD_RUN_DIR"); d != nullptr && *d != '\0')
    return std::filesystem::path(d) / "waits";
  std::string job;
  for (const char* v : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"})
    if (const char* j = std::getenv(v); j != nullptr && *j != '\0') {
      job = j;
      break;
    }
  if (job.empty())
    return {};
  std::error_code ec;
  std::filesystem::path base = "/dev/shm";
  if (!std::filesystem::is_directory(base, ec))
    base = std::filesystem::temp_directory_path(ec);
  return base / ("hspmd-waits-" + std::to_string(::getuid()) + "-" + to_hex(fnv1a64(job)));
}

/// Removes the marker folders of ended jobs next to `mine` (same user's prefix): those whose
/// host markers name only processes that no longer exist (a job that crashed leaves its folder).
inline void sweep_stale_markers(const std::filesystem::path& mine) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string prefix = "hspmd-waits-" + std::to_string(::getuid()) + "-";
  for (const auto& e : fs::directory_iterator(mine.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (e.path() == mine || name.rfind(prefix, 0) != 0 || !e.is_directory(ec))
      continue;
    bool alive = false;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) {
      if (f.path().filename().string().rfind("host-r", 0) != 0)
        continue;
      long pid = 0;
      std::ifstream(f.path()) >> pid;
      alive = alive || pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
    }
    if (!alive)
      fs::remove_all(e.path(), ec);
  }
}

/// The members of `members` (world ranks) that left no wait marker (see `wait_markers`) for the
/// call `name` in `dir`, of those whose host marker is there; `unseen` counts those without one
/// (other hosts). Not collective.
[[nodiscard]] inline std::vector<int> not_arrived(const std::filesystem::path& dir,
                                                  const std::string& name,
                                                  const std::vector<int>& members,
                                                  std::size_t* unseen = nullptr) {
  std::vector<int> missing;
  std::size_t other_hosts = 0;
  std::error_code ec;
  for (int r : members) {
    if (!std::filesystem::exists(dir / ("host-r" + std::to_string(r)), ec))
      ++other_hosts;
    else if (!std::filesystem::exists(dir / (name + "-r" + std::to_string(r)), ec))
      missing.push_back(r);
  }
  if (unseen != nullptr)
    *unseen = other_hosts;
  return missing;
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
    mark_host_locked();
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

  /// The communicator's members as world ranks (this process is `world_rank`), for naming the
  /// ranks that have not arrived (see the file comment). Leaves this process's host marker.
  void set_members(int world_rank, std::vector<int> members) {
    const std::scoped_lock lock(mutex_);
    world_rank_ = world_rank;
    std::string key;
    for (int r : members)
      key += std::to_string(r) + ",";
    group_ = to_hex(fnv1a64(key)).substr(0, 8);
    whole_world_ = true;
    for (std::size_t i = 0; i < members.size(); ++i)
      whole_world_ = whole_world_ && members[i] == static_cast<int>(i);
    members_ = std::move(members);
    mark_host_locked();
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

  // This process's host marker (see the file comment), once, when waits are watched.
  void mark_host_locked() const {
    if (markers_.empty() || world_rank_ < 0 || !(timeout_ > 0.0))
      return;
    std::error_code ec;
    std::filesystem::create_directories(markers_, ec);
    const auto host = markers_ / ("host-r" + std::to_string(world_rank_));
    if (ec || std::filesystem::exists(host, ec))
      return;
    std::ofstream(host) << ::getpid() << "\n";
    sweep_stale_markers(markers_);
    // Removed when the process ends normally (with the folder, by the last rank).
    static struct removal {
      std::filesystem::path file;
      removal() = default;
      removal(const removal&) = delete;
      removal& operator=(const removal&) = delete;
      removal(removal&&) = delete;
      removal& operator=(removal&&) = delete;
      ~removal() {
        std::error_code e;
        if (!file.empty()) {
          std::filesystem::remove(file, e);
          std::filesystem::remove(file.parent_path(), e); // only when empty
        }
      }
    } at_exit;
    at_exit.file = host;
  }

  // The marker name of the current wait ("" when it leaves none: a point-to-point wait, or no
  // marker folder or members known).
  [[nodiscard]] std::string marker_locked() const {
    if (markers_.empty() || members_.empty() || current_.point_to_point != nullptr)
      return {};
    return "wait-" + group_ + "-" + std::to_string(current_.call.sequence);
  }

  // Names the members without a marker of this wait, after giving them up to `grace` seconds.
  // Called unlocked, from the thread; "" when nobody is known missing.
  [[nodiscard]] std::string missing_text(const std::string& name, double grace) const {
    std::vector<int> missing;
    std::size_t unseen = 0;
    const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(
                                          std::chrono::duration<double>(grace));
    do {
      missing = not_arrived(markers_, name, members_, &unseen);
      if (missing.empty())
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (clock::now() < until);
    std::string s;
    if (!missing.empty()) {
      s = std::string("; not arrived: ") + (whole_world_ ? "rank" : "world rank") +
          (missing.size() > 1 ? "s " : " ");
      for (std::size_t i = 0; i < missing.size(); ++i)
        s += (i > 0 ? ", " : "") + std::to_string(missing[i]);
    }
    if (unseen > 0)
      s += "; " + std::to_string(unseen) + " rank(s) on other hosts not checked";
    return s;
  }

  void leave_marker(const std::string& name) const {
    std::ofstream(markers_ / (name + "-r" + std::to_string(world_rank_)));
  }

  void run() {
    std::unique_lock lock(mutex_);
    const auto period = std::chrono::duration_cast<clock::duration>(
        std::chrono::duration<double>(std::min(0.25, timeout_ / 4.0)));
    std::string marked; // the wait this rank left a marker for
    while (!quit_) {
      wake_.wait_for(lock, period);
      if (quit_ || !waiting_)
        continue;
      const auto now = clock::now();
      const double waited = std::chrono::duration<double>(now - since_).count();
      const std::string name = marker_locked();
      if (waited >= timeout_ / 2.0 && !name.empty() && marked != name) {
        leave_marker(name); // peers that time out see this rank has arrived
        marked = name;
      }
      if (waited < timeout_)
        continue;
      std::string line = "[hspmd rank " + std::to_string(rank_) + "] " + report_locked(now);
      lock.unlock();
      if (!name.empty()) // (the marker is there: this wait reached half the timeout first)
        line += missing_text(name, std::min(1.0, timeout_ / 2.0));
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::milliseconds(500)); // let peers report too
      if (!markers_.empty() && world_rank_ >= 0) { // this rank's markers (the folder goes
        std::error_code ec;                        // with the last)
        if (!name.empty())
          std::filesystem::remove(markers_ / (name + "-r" + std::to_string(world_rank_)), ec);
        std::filesystem::remove(markers_ / ("host-r" + std::to_string(world_rank_)), ec);
        std::filesystem::remove(markers_, ec);
      }
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
  std::filesystem::path markers_ = wait_markers();
  int world_rank_ = -1;
  std::vector<int> members_; // world ranks
  std::string group_;        // their hash, in marker names
  bool whole_world_ = false;
};

} // namespace hspmd
