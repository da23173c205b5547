// hspmd-run: the elastic launcher. Starts a training program under mpirun, one rank per device
// of a cluster file, and watches it. When the job fails it names the devices it lost (the
// job's own lines: a rank's fault or error, Open MPI's signal line, the watchdog's "not
// arrived"), writes the cluster that remains, and starts the program again on it with --resume:
// the trainer plans for the remaining devices (their uneven shares re-solved) and loads the
// newest checkpoint, resharded onto the new plan. It gives up, saying why, when fewer than
// --min-devices remain, after --max-restarts, or when the job fails twice without a step and
// without losing a device. A device listed again in the membership file (RUN_DIR/membership,
// which hspmd-run keeps) joins at the next step: the job is asked to stop after its current
// step (saved), and starts again on the grown cluster. It never leaves a process behind.
//
//   hspmd-run --cluster clusters/emulated-3.json --run-dir run --
//       build/release/examples/bert --steps 200 --save-every 1 --checkpoint-dir run/ck
//       --metrics run/metrics.jsonl          (one command line)
//
// The program gets `--cluster RUN/cluster-gen-K.json --resume` appended and, in its
// environment, HSPMD_RUN_DIR, HSPMD_RUN_GENERATION and HSPMD_TIMEOUT (the watchdog's limit:
// a stopped or hung rank ends the job within it). Each membership change is one line here and
// one record {"event":"membership",...} in the program's --metrics file. Launcher flags
// (--oversubscribe, --allow-run-as-root) are the user's: --mpirun-arg.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/io/cli.hpp>
#include <hspmd/train/elastic.hpp>
#include <hspmd/train/metrics_log.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using hspmd::config_error;

namespace {

volatile std::sig_atomic_t interrupted = 0; // the signal that asked the launcher to stop

extern "C" void on_signal(int s) {
  interrupted = s;
}

struct options {
  std::string cluster_file;
  std::string run_dir;
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;
  std::size_t max_restarts = 10;
  std::size_t min_devices = 1;
  double backoff = 1.0;
  double timeout = 30.0;
  std::vector<std::string> faults; // "GEN:SPEC": HSPMD_FAULT of generation GEN (tests)
  std::string membership;          // the membership file (default RUN_DIR/membership)
  std::size_t rejoin_after = 0;    // testing: a lost device is listed again after this many steps
  std::string fault_schedule;      // testing: "seed:S,count:N,kinds:K/K,gap:A-B"
  std::vector<std::string> command;
};

// One generation's run: its exit status, its lines and when the first sign of failure came.
struct job_result {
  int status = 0; // the wait status
  std::vector<std::string> lines;
  std::optional<double> failed_at; // unix seconds
  double ended_at = 0.0;
  bool stop_requested = false;     // the launcher asked it to stop (membership change)
  std::map<int, std::string> gone; // ranks of this host whose process had ended when it failed
};

// A process killed by SIGKILL that has not finished ending or is not yet reaped: exiting (its
// PF_EXITING flag: a large address space takes a while to tear down) or a zombie, with signal 9
// as its exit code (/proc/PID/stat fields 9 and 52). Signal 0 still reaches it. Processes that
// mpirun ends (SIGTERM) do not count.
bool ended(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto close = text.rfind(") ");
  if (close == std::string::npos)
    return false;
  std::istringstream fields(text.substr(close + 2));
  std::vector<std::string> f;
  for (std::string w; fields >> w;)
    f.push_back(w);
  if (f.size() < 50)
    return false;
  constexpr unsigned long pf_exiting = 0x4;
  const bool exiting = f[0] == "Z" || f[0] == "X" || (std::stoul(f[6]) & pf_exiting) != 0;
  return exiting && (std::stol(f.back()) & 0x7f) == SIGKILL;
}

// The ranks of this host whose process is gone, from their host markers (RUN_DIR/waits/host-rR
// holds the rank's pid; comm/watchdog.hpp).
std::map<int, std::string> gone_ranks(const fs::path& markers) {
  std::map<int, std::string> gone;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(markers, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("host-r", 0) != 0 ||
        name.find_first_not_of("0123456789", 6) != std::string::npos || name.size() == 6)
      continue;
    long pid = 0;
    std::ifstream(e.path()) >> pid;
    if (pid > 0 && ((::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) || ended(pid)))
      gone.emplace(std::stoi(name.substr(6)), "its process ended");
  }
  return gone;
}

// The value of `flag` in the program's arguments ("--flag V" or "--flag=V"), if given.
std::optional<std::string> arg_value(const std::vector<std::string>& args,
                                     const std::string& flag) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size())
      return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0)
      return args[i].substr(flag.size() + 1);
  }
  return std::nullopt;
}

// Kills what is left of a job: its process group, then any process it left that was
// re-parented to the launcher (a subreaper), until none is found.
void tear_down(pid_t group) {
  if (group > 0)
    ::kill(-group, SIGKILL);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    bool found = false;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
      const std::string pid = e.path().filename().string();
      if (pid.find_first_not_of("0123456789") != std::string::npos)
        continue;
      std::ifstream stat(e.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const auto close = line.rfind(')');
      if (close == std::string::npos)
        continue;
      char state = 0;
      long ppid = 0;
      long pgid = 0;
      if (std::sscanf(line.c_str() + close + 1, " %c %ld %ld", &state, &ppid, &pgid) != 3)
        continue;
      if (state == 'Z' && ppid == ::getpid())
        continue; // reaped below
      if (ppid == ::getpid() || (group > 0 && pgid == group)) {
        found = true;
        ::kill(static_cast<pid_t>(std::stol(pid)), SIGKILL);
      }
    }
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (!found)
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Runs `argv` in its own process group, its output (stdout and stderr) passed through line by
// line and kept. Every tenth of a second asks `want_stop` whether the devices should change; when
// they should, creates `stop_file` (the trainer stops after its current step, saved). Returns when
// it has ended and nothing of it is left.
job_result run_job(const std::vector<std::string>& argv, const std::function<bool()>& want_stop,
                   const fs::path& stop_file, const fs::path& markers) {
  static const std::regex failure_sign(R"(HSPMD_FAULT|noticed that process rank|not arrived|)"
                                       R"(Process name|MPI_ABORT|^\[hspmd rank)");
  // Lines after which the job is over (mpirun has seen a rank end, or the watchdog ends one):
  // the launcher ends it a moment later rather than wait for mpirun's own teardown (a second
  // between its SIGTERM and SIGKILL).
  static const std::regex job_over(R"(noticed that process rank|Exit code:|MPI_ABORT was invoked|)"
                                   R"(not arrived: |the job has been aborted)");
  int fds[2];
  if (::pipe(fds) != 0)
    throw std::runtime_error(std::string("cannot make a pipe: ") + std::strerror(errno));
  const pid_t child = ::fork();
  if (child < 0)
    throw std::runtime_error(std::string("cannot fork: ") + std::strerror(errno));
  if (child == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL); // the job ends if the launcher is killed
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "hspmd-run: cannot start %s: %s\n", args[0], std::strerror(errno));
    std::_Exit(127);
  }
  ::setpgid(child, child);
  ::close(fds[1]);
  job_result r;
  std::string pending;
  bool open = true;
  bool asked_to_stop = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto next_check = std::chrono::steady_clock::now();
  auto end_at = std::chrono::steady_clock::time_point::max(); // the job is over: end it then
  std::error_code ec;
  fs::remove(stop_file, ec);
  const auto take = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (!r.failed_at && std::regex_search(line, failure_sign))
      r.failed_at = hspmd::train::unix_seconds();
    if (end_at == std::chrono::steady_clock::time_point::max() &&
        std::regex_search(line, job_over)) {
      end_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      r.gone = gone_ranks(markers); // before the launcher ends the rest
    }
    r.lines.push_back(line);
  };
  bool reaped = false;
  auto drain_deadline = std::chrono::steady_clock::time_point::max();
  while (open && std::chrono::steady_clock::now() < drain_deadline) {
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, 100);
    if (!reaped && ::waitpid(child, &r.status, WNOHANG) == child) {
      // mpirun has ended: what is still buffered comes within a second (a process it left
      // behind may hold the pipe open).
      reaped = true;
      drain_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
    if (interrupted != 0 && !asked_to_stop) { // forward once, then insist
      ::kill(-child, SIGTERM);
      asked_to_stop = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    }
    if ((asked_to_stop && std::chrono::steady_clock::now() > stop_deadline) ||
        (!reaped && std::chrono::steady_clock::now() > end_at))
      ::kill(-child, SIGKILL);
    if (!r.stop_requested && std::chrono::steady_clock::now() > next_check) {
      next_check = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      if (want_stop()) {
        std::ofstream(stop_file) << "membership change\n";
        r.stop_requested = true;
      }
    }
    if (n <= 0)
      continue;
    char buf[4096];
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got <= 0) {
      open = got < 0 && errno == EINTR;
      continue;
    }
    pending.append(buf, static_cast<std::size_t>(got));
    for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
      take(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty())
    take(pending);
  ::close(fds[0]);
  while (!reaped && ::waitpid(child, &r.status, 0) < 0 && errno == EINTR) {
  }
  r.ended_at = hspmd::train::unix_seconds();
  tear_down(child);
  fs::remove(stop_file, ec);
  return r;
}

std::string status_text(int status) {
  if (WIFEXITED(status))
    return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Appends one record to the program's metrics file (between generations: nobody writes it).
void record(const std::optional<std::string>& metrics, nlohmann::json j) {
  if (!metrics)
    return;
  j["t"] = hspmd::train::unix_seconds();
  std::ofstream(*metrics, std::ios::app) << j.dump() << "\n";
}

// Testing: seeded faults, one per generation of 2 devices or more until `left` are spent: a
// random rank of the generation, a random kind of `kinds`, `gap` steps (a random count in [lo, hi])
// after the last step the metrics file records.
struct fault_schedule {
  std::mt19937_64 rng;
  std::size_t left = 0;
  std::vector<std::string> kinds;
  std::size_t lo = 2;
  std::size_t hi = 10;

  static fault_schedule parse(const std::string& text) {
    fault_schedule f;
    const auto bad = [&](const std::string& why) {
      return config_error("--faults " + text, why,
                          "e.g. --faults seed:47,count:10,kinds:kill/stop/exit1/throw,gap:3-12");
    };
    std::istringstream in(text);
    std::uint64_t seed = 0;
    for (std::string field; std::getline(in, field, ',');) {
      const auto colon = field.find(':');
      if (colon == std::string::npos)
        throw bad("field \"" + field + "\" is not KEY:VALUE");
      const std::string key = field.substr(0, colon);
      const std::string value = field.substr(colon + 1);
      try {
        if (key == "seed")
          seed = std::stoull(value);
        else if (key == "count")
          f.left = std::stoul(value);
        else if (key == "gap") {
          f.lo = std::stoul(value.substr(0, value.find('-')));
          f.hi = std::stoul(value.substr(value.find('-') + 1));
        } else if (key == "kinds") {
          std::istringstream k(value);
          for (std::string kind; std::getline(k, kind, '/');)
            f.kinds.push_back(kind);
        } else
          throw bad("unknown field \"" + key + "\"");
      } catch (const std::logic_error&) {
        throw bad("field " + key + " is not a number");
      }
    }
    if (f.kinds.empty() || f.left == 0 || f.lo == 0 || f.hi < f.lo)
      throw bad("needs count >= 1, kinds and a gap of at least 1");
    f.rng.seed(seed);
    return f;
  }

  // HSPMD_FAULT for a generation of `ranks` ranks whose metrics file is at step `step`.
  std::string next(std::size_t ranks, std::size_t step) {
    if (ranks < 2)
      return {}; // the last device is not failed on purpose
    const std::size_t rank = rng() % ranks;
    const std::size_t at = step + f_lo_hi();
    const std::string& kind = kinds[rng() % kinds.size()];
    return "rank:" + std::to_string(rank) + ",at:step" + std::to_string(at) + ",kind:" + kind;
  }

private:
  std::size_t f_lo_hi() { return lo + rng() % (hi - lo + 1); }
};

// The device names a membership file lists (one a line; blank lines and # comments skipped).
std::vector<std::string> read_membership(const fs::path& file) {
  std::vector<std::string> names;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto hash = line.find('#');
    if (hash != std::string::npos)
      line.erase(hash);
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos)
      continue;
    names.push_back(line.substr(b, line.find_last_not_of(" \t\r") - b + 1));
  }
  return names;
}

void write_membership(const fs::path& file, const std::vector<std::string>& names,
                      const std::vector<std::string>& comments) {
  std::string text = "# devices hspmd-run trains on: list a device of the cluster file again to "
                     "take it back at the next step; remove one to let it go\n";
  for (const std::string& c : comments)
    text += "# " + c + "\n";
  for (const std::string& n : names)
    text += n + "\n";
  const fs::path tmp = file.string() + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, file);
}

// The original cluster's devices that `names` lists, in the original order, as generation `gen`.
hspmd::cluster members_of(const hspmd::cluster& original, const std::vector<std::string>& names,
                          std::size_t gen, const std::string& base) {
  std::vector<int> out;
  for (std::size_t d = 0; d < original.size(); ++d)
    if (std::ranges::find(names, original.devices[d].name) == names.end())
      out.push_back(static_cast<int>(d));
  return hspmd::train::remaining_cluster(original, out, gen, base);
}

int elastic_run(const options& o) {
  using hspmd::train::device_list;
  const hspmd::cluster original = hspmd::load_cluster(o.cluster_file);
  for (const std::string& flag : {std::string("--cluster"), std::string("--resume")})
    if (arg_value(o.command, flag) || std::ranges::find(o.command, flag) != o.command.end())
      throw config_error("the program's arguments", "give " + flag,
                         "leave it out: hspmd-run gives --cluster (the devices of each "
                         "generation) and --resume");
  if (!arg_value(o.command, "--checkpoint-dir"))
    throw config_error("the program's arguments", "have no --checkpoint-dir",
                       "give --checkpoint-dir and --save-every: a restart resumes from there");
  std::map<std::size_t, std::string> faults;
  for (const std::string& f : o.faults) {
    const auto colon = f.find(':');
    if (colon == std::string::npos || colon == 0 ||
        f.substr(0, colon).find_first_not_of("0123456789") != std::string::npos)
      throw config_error("--fault " + f, "is not GENERATION:SPEC",
                         "e.g. --fault 0:rank:1,at:step6,kind:kill");
    faults[std::stoul(f.substr(0, colon))] = f.substr(colon + 1);
  }
  std::optional<fault_schedule> schedule;
  if (!o.fault_schedule.empty())
    schedule = fault_schedule::parse(o.fault_schedule);
  const auto metrics = arg_value(o.command, "--metrics");
  const std::string base = original.name.empty() ? "cluster" : original.name;
  fs::create_directories(o.run_dir);
  const std::string run_dir = fs::absolute(o.run_dir).string();
  record(metrics, {{"event", "launch"}, {"devices", original.size()}});

  // The membership file: the devices to train on. hspmd-run drops a lost device from it; a
  // device listed again (by the user, or by --rejoin-after) joins at the next step.
  const fs::path membership =
      o.membership.empty() ? fs::path(run_dir) / "membership" : fs::path(o.membership);
  std::vector<std::string> comments;
  std::map<std::string, std::size_t> lost_at; // device -> the step it was lost after
  {
    std::vector<std::string> all;
    for (const auto& d : original.devices)
      all.push_back(d.name);
    write_membership(membership, all, comments);
  }
  const auto wanted = [&] { // the original's devices the file lists, in the original order
    const auto names = read_membership(membership);
    std::vector<std::string> w;
    for (const auto& d : original.devices)
      if (std::ranges::find(names, d.name) != names.end())
        w.push_back(d.name);
    return w;
  };
  const auto names_of = [](const hspmd::cluster& cl) {
    std::vector<std::string> v;
    for (const auto& d : cl.devices)
      v.push_back(d.name);
    return v;
  };

  hspmd::cluster c = original;
  std::optional<hspmd::train::step_follower> follow; // the metrics file's last step, read on
  if (metrics)
    follow.emplace(*metrics);
  std::size_t restarts = 0;
  std::size_t quick_failures = 0; // failures in a row without a completed step
  std::size_t fruitless = 0;      // failures in a row without a step and without a lost device
  for (std::size_t gen = 0;; ++gen) {
    const std::string file = run_dir + "/cluster-gen" + std::to_string(gen) + ".json";
    std::ofstream(file) << hspmd::to_json(c).dump(2) << "\n";
    ::setenv("HSPMD_RUN_DIR", run_dir.c_str(), 1);
    ::setenv("HSPMD_RUN_GENERATION", std::to_string(gen).c_str(), 1);
    char timeout[32];
    std::snprintf(timeout, sizeof timeout, "%g", o.timeout);
    ::setenv("HSPMD_TIMEOUT", timeout, 1);
    std::vector<std::string> argv{o.mpirun};
    argv.insert(argv.end(), o.mpirun_args.begin(), o.mpirun_args.end());
    for (const char* v : {"HSPMD_RUN_DIR", "HSPMD_RUN_GENERATION", "HSPMD_TIMEOUT"})
      argv.insert(argv.end(), {"-x", v});
    std::string fault;
    if (const auto it = faults.find(gen); it != faults.end())
      fault = it->second;
    else if (schedule && schedule->left > 0) // testing: the next of the seeded faults
      fault = schedule->next(c.size(), follow ? (*follow)() : 0);
    if (!fault.empty()) {
      ::setenv("HSPMD_FAULT", fault.c_str(), 1);
      argv.insert(argv.end(), {"-x", "HSPMD_FAULT"});
    } else
      ::unsetenv("HSPMD_FAULT");
    argv.insert(argv.end(), {"-n", std::to_string(c.size())});
    argv.insert(argv.end(), o.command.begin(), o.command.end());
    argv.insert(argv.end(), {"--cluster", file, "--resume"});
    const std::size_t step_before = follow ? (*follow)() : 0;
    std::printf("hspmd-run: generation %zu on %zu device(s): %s\n", gen, c.size(),
                device_list(c).c_str());
    std::fflush(stdout);
    const auto want_stop = [&] {
      if (o.rejoin_after > 0 && !lost_at.empty() && follow) { // testing: lost devices return
        const std::size_t now = (*follow)();
        auto names = read_membership(membership);
        bool changed = false;
        for (auto it = lost_at.begin(); it != lost_at.end();)
          if (now >= it->second + o.rejoin_after) {
            names.push_back(it->first);
            comments.push_back(it->first + " listed again after step " + std::to_string(now) +
                               " (--rejoin-after " + std::to_string(o.rejoin_after) + ")");
            it = lost_at.erase(it);
            changed = true;
          } else
            ++it;
        if (changed)
          write_membership(membership, names, comments);
      }
      const auto w = wanted();
      return !w.empty() && w != names_of(c);
    };
    const fs::path markers = fs::path(run_dir) / "waits"; // this generation's (watchdog.hpp)
    fs::remove_all(markers);
    const job_result job = run_job(argv, want_stop, fs::path(run_dir) / "stop", markers);
    if (interrupted != 0) {
      std::printf("hspmd-run: stopped by signal %d; the job is ended\n",
                  static_cast<int>(interrupted));
      return 128 + static_cast<int>(interrupted);
    }
    const bool stopped =
        job.stop_requested && std::ranges::any_of(job.lines, [](const std::string& l) {
          return l.find("stopped after step") != std::string::npos;
        });
    if (WIFEXITED(job.status) && WEXITSTATUS(job.status) == 0 && !stopped) {
      std::printf("hspmd-run: finished on %zu device(s) after %zu restart(s)\n", c.size(),
                  restarts);
      return 0;
    }
    if (WIFEXITED(job.status) && WEXITSTATUS(job.status) == 0) { // the devices change
      const auto before = names_of(c);
      c = members_of(original, wanted(), gen + 1, base);
      const auto after = names_of(c);
      std::vector<std::string> joined;
      std::vector<std::string> left;
      for (const auto& n : after)
        if (std::ranges::find(before, n) == before.end())
          joined.push_back(n);
      for (const auto& n : before)
        if (std::ranges::find(after, n) == after.end())
          left.push_back(n);
      const std::size_t step = follow ? (*follow)() : 0;
      std::string what;
      for (const auto& n : joined)
        what += (what.empty() ? "" : ", ") + n + " joins";
      for (const auto& n : left)
        what += (what.empty() ? "" : ", ") + n + " leaves";
      std::printf("hspmd-run: %s after step %zu; generation %zu on %s\n", what.c_str(), step,
                  gen + 1, device_list(c).c_str());
      std::fflush(stdout);
      nlohmann::json rec{{"event", "membership"},   {"generation", gen + 1},
                         {"joined", joined},        {"left", left},
                         {"after_step", step},      {"devices", after},
                         {"ended_at", job.ended_at}};
      rec["relaunch_at"] = hspmd::train::unix_seconds();
      record(metrics, std::move(rec));
      quick_failures = 0;
      fruitless = 0;
      continue;
    }
    const std::size_t step_after = follow ? (*follow)() : 0;
    const bool progressed = step_after > step_before;
    quick_failures = progressed ? 0 : quick_failures + 1;
    if (schedule && schedule->left > 0 && !fault.empty() && !faults.contains(gen))
      --schedule->left; // (a run that ended before the fault's step keeps it: not here)
    auto lost = hspmd::train::attribute(job.lines);
    if (!lost.definite && !job.gone.empty()) // a rank's process ended: it is the one lost
      lost = {job.gone, true};
    else if (lost.definite)
      for (const auto& [rank, cause] : job.gone)
        lost.ranks.emplace(rank, cause);
    // The job's own last error line (a rank's "[hspmd rank R] ..."), else its last line.
    std::string last_line = job.lines.empty() ? std::string("(no output)") : job.lines.back();
    for (auto it = job.lines.rbegin(); it != job.lines.rend(); ++it)
      if (it->starts_with("[hspmd rank ")) {
        last_line = *it;
        break;
      }
    const auto give_up = [&](const std::string& why) {
      std::printf("hspmd-run: gave up: %s\n", why.c_str());
      record(metrics, {{"event", "gave_up"}, {"generation", gen}, {"reason", why}});
      return 1;
    };
    if (const auto steps = arg_value(o.command, "--steps");
        steps && steps->find_first_not_of("0123456789") == std::string::npos && !steps->empty() &&
        step_after >= std::stoul(*steps) && !lost.definite)
      return give_up("the job trained all " + *steps + " steps, then failed (" +
                     status_text(job.status) + "); its last line: " + last_line);
    if (restarts >= o.max_restarts)
      return give_up("the job failed again after " + std::to_string(restarts) +
                     " restart(s) (--max-restarts " + std::to_string(o.max_restarts) + ")");
    // --backoff after a generation that trained, doubling with each quick failure after it.
    const double wait = std::min(
        30.0,
        o.backoff *
            std::pow(2.0, static_cast<double>(std::max<std::size_t>(quick_failures, 1)) - 1.0));
    if (progressed)
      fruitless = 0;
    if (lost.ranks.empty() || (!lost.definite && !progressed)) {
      // No device is known lost (an error every rank may share, a failure naming none): once
      // more on the same devices, then the job's own error.
      if (++fruitless >= 2)
        return give_up("the job failed twice on the same devices without a completed step (" +
                       status_text(job.status) + "); its last line: " + last_line);
      std::printf("hspmd-run: the job failed (%s) %s; generation %zu on the same devices\n",
                  status_text(job.status).c_str(),
                  lost.ranks.empty() ? "naming no lost device"
                                     : "without a step and without a device known lost",
                  gen + 1);
      std::fflush(stdout);
      record(metrics, {{"event", "retry"},
                       {"generation", gen + 1},
                       {"after_step", step_after},
                       {"reason", last_line},
                       {"relaunch_at", hspmd::train::unix_seconds()}});
      if (wait > 0.0)
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      ++restarts;
      continue;
    }
    fruitless = 0;
    std::vector<int> ranks;
    std::vector<std::string> names;
    std::vector<std::string> causes;
    for (const auto& [rank, cause] : lost.ranks) {
      ranks.push_back(rank);
      names.push_back(static_cast<std::size_t>(rank) < c.size()
                          ? c.devices[static_cast<std::size_t>(rank)].name
                          : "rank " + std::to_string(rank));
      causes.push_back(cause);
    }
    // The next generation: the membership file's devices (one listed again while this
    // generation ran joins now) less the lost ones.
    std::vector<std::string> keep;
    for (const std::string& n : wanted())
      if (std::ranges::find(names, n) == names.end())
        keep.push_back(n);
    if (keep.size() < o.min_devices)
      return give_up(std::to_string(keep.size()) + " device(s) left, fewer than --min-devices " +
                     std::to_string(o.min_devices));
    c = members_of(original, keep, gen + 1, base);
    for (std::size_t i = 0; i < names.size(); ++i) {
      lost_at[names[i]] = step_after;
      comments.push_back(names[i] + " lost after step " + std::to_string(step_after) + ": " +
                         causes[i]);
    }
    write_membership(membership, keep, comments);
    std::string lost_text;
    for (std::size_t i = 0; i < ranks.size(); ++i)
      lost_text += (i > 0 ? ", " : "") + names[i] + " (rank " + std::to_string(ranks[i]) + ": " +
                   causes[i] + ")";
    std::printf("hspmd-run: lost %s after step %zu; generation %zu on %s%s\n", lost_text.c_str(),
                step_after, gen + 1, device_list(c).c_str(),
                wait > 0.0 ? (" in " + std::to_string(wait).substr(0, 4) + " s").c_str() : "");
    std::fflush(stdout);
    if (wait > 0.0)
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    nlohmann::json rec{{"event", "membership"},
                       {"generation", gen + 1},
                       {"lost", names},
                       {"causes", causes},
                       {"after_step", step_after},
                       {"devices", nlohmann::json::array()},
                       {"ended_at", job.ended_at},
                       {"relaunch_at", hspmd::train::unix_seconds()}};
    for (const auto& d : c.devices)
      rec["devices"].push_back(d.name);
    if (job.failed_at)
      rec["failed_at"] = *job.failed_at;
    record(metrics, std::move(rec));
    ++restarts;
  }
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"hspmd-run: run a training program under mpirun on a cluster's devices; when "
               "devices are lost, re-plan for the rest and resume (docs/execution.md)"};
  options o;
  app.add_option("--cluster", o.cluster_file, "the cluster file: one rank per device")->required();
  app.add_option("--run-dir", o.run_dir,
                 "where each generation's cluster file and the ranks' markers go")
      ->required();
  app.add_option("--mpirun", o.mpirun, "the MPI launcher")->capture_default_str();
  app.add_option("--mpirun-arg", o.mpirun_args,
                 "an argument for mpirun (repeat; e.g. --mpirun-arg=--oversubscribe)");
  app.add_option("--max-restarts", o.max_restarts, "restarts before giving up")
      ->capture_default_str();
  app.add_option("--min-devices", o.min_devices, "give up when fewer devices remain")
      ->capture_default_str()
      ->check(hspmd::io::at_least_one);
  app.add_option("--backoff", o.backoff,
                 "seconds before a restart, doubled for each failure in a row without a step "
                 "(at most 30)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 30.0));
  app.add_option("--timeout", o.timeout,
                 "HSPMD_TIMEOUT of the job: a rank that stops or hangs ends it within this many "
                 "seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 1e6));
  app.add_option("--membership", o.membership,
                 "the file of devices to train on (default RUN_DIR/membership): list a device "
                 "of the cluster file again and it joins at the next step")
      ->capture_default_str();
  app.add_option("--rejoin-after", o.rejoin_after,
                 "testing: list a lost device again after this many more steps (0: never)")
      ->capture_default_str();
  app.add_option("--faults", o.fault_schedule,
                 "testing: seeded faults, one per generation: seed:S,count:N,kinds:kill/stop/..."
                 ",gap:A-B (steps after the last recorded)");
  app.add_option("--fault", o.faults,
                 "GENERATION:SPEC: HSPMD_FAULT for that generation only (testing; repeat)");
  app.footer("After the flags: -- PROGRAM ARGS... (the training program and its arguments)");
  // The program's arguments are not the launcher's: split at the first "--".
  int own = argc;
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") {
      own = i;
      break;
    }
  for (int i = own + 1; i < argc; ++i)
    o.command.emplace_back(argv[i]);
  if (const auto rc = hspmd::io::parse_flags(app, own, argv))
    return *rc;
  if (o.command.empty()) {
    std::fprintf(stderr, "hspmd-run: no program given: end the flags with -- PROGRAM ARGS...\n");
    return 2;
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 1); // ranks orphaned by a dying mpirun come back here
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  try {
    return elastic_run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hspmd-run: %s\n", e.what());
    return 1;
  }
}
