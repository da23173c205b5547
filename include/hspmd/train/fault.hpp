#pragma once
// Fault injection for testing what a job does when one rank fails (HSPMD_FAULT).
//
//     HSPMD_FAULT=rank:1,at:step5,kind:hang
//
// At the start of training step 5 (counted from 1, as the progress line counts), rank 1 prints
// "[hspmd rank 1] HSPMD_FAULT: <kind> at step 5" and then:
//   abort   calls std::abort (SIGABRT)          kill   sends itself SIGKILL
//   exit0   ends with status 0, no MPI_Finalize  exit1  ends with status 1
//   throw   throws, as a failing step would      hang   sleeps forever (peers wait on it)
//   stop    sends itself SIGSTOP (as `kill -STOP` does: alive, never scheduled again)
//   slow:F  computes F times slower from then on (F >= 1; the trainer's emulated slowdown)
//   vanish  sends itself SIGKILL without printing the line, as a lost machine's rank ends
//   node    every rank on rank R's node vanishes, and the node's RAM tier folder (--ram-dir) is
//           removed first: the whole machine is lost, its memory with it
// With at:saveN:POINT the fault strikes while the checkpoint of step N is saved
// (train/checkpoint.hpp), at POINT: shards (this rank's file written, not yet flushed), written
// (flushed, before the ranks exchange their pieces), manifest (rank 0: the manifest written
// under its temporary name, not renamed), latest (rank 0: the directory committed, `latest` not
// yet updated).
// The library trainer reads the variable at start (a bad value is refused in one line) and
// injects it; nothing else does.

#include <hspmd/core/error.hpp>
#include <hspmd/train/namespace.hpp>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace hspmd::train {

/// One injected fault (see the file comment).
struct fault_spec {
  enum class kind : std::uint8_t {
    abort,
    kill,
    exit0,
    exit1,
    thrown,
    hang,
    stop,
    slow,
    vanish,
    node
  };
  int rank = 0;
  std::size_t step = 1; ///< 1-based
  kind what = kind::abort;
  double factor = 1.0;    ///< slow: the extra slowdown
  std::string save_point; ///< at:saveN:POINT: the point (then `step` is N); empty: a step

  /// "step 5" or "the save of step 4, at its manifest".
  [[nodiscard]] std::string where() const {
    return save_point.empty() ? "step " + std::to_string(step)
                              : "the save of step " + std::to_string(step) + ", at " + save_point;
  }

  /// "abort", ..., "slow:3".
  [[nodiscard]] std::string kind_text() const {
    constexpr std::string_view names[] = {"abort", "kill", "exit0", "exit1",  "throw",
                                          "hang",  "stop", "slow",  "vanish", "node"};
    std::string s(names[static_cast<std::size_t>(what)]);
    if (what == kind::slow) {
      char f[32];
      std::snprintf(f, sizeof f, ":%g", factor);
      s += f;
    }
    return s;
  }
};

/// Parses "rank:R,at:stepN,kind:K" (fields in any order, each once; "at:N" also accepted).
/// Throws `config_error` naming `where` and the bad field.
[[nodiscard]] inline fault_spec parse_fault(std::string_view text,
                                            std::string_view where = "HSPMD_FAULT") {
  const std::string w(where);
  const auto bad = [&](const std::string& why) {
    return config_error(w + "=" + std::string(text), why,
                        "write rank:R,at:stepN,kind:K (or at:saveN:POINT) with K one of abort, "
                        "kill, exit0, exit1, throw, hang, stop, slow:F");
  };
  const auto number = [&](std::string_view s, const char* field) {
    std::size_t v = 0;
    if (s.empty() || s.size() > 9)
      throw bad(std::string(field) + " needs a whole number");
    for (char c : s) {
      if (c < '0' || c > '9')
        throw bad(std::string(field) + " needs a whole number, not \"" + std::string(s) + "\"");
      v = v * 10 + static_cast<std::size_t>(c - '0');
    }
    return v;
  };
  fault_spec f;
  bool has_rank = false;
  bool has_at = false;
  bool has_kind = false;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos)
      throw bad("\"" + std::string(item) + "\" is not field:value");
    const std::string_view key = item.substr(0, colon);
    std::string_view value = item.substr(colon + 1);
    if (key == "rank" && !has_rank) {
      f.rank = static_cast<int>(number(value, "rank"));
      has_rank = true;
    } else if (key == "at" && !has_at) {
      if (value.starts_with("save")) {
        value.remove_prefix(4);
        const std::size_t c = value.find(':');
        const std::string_view point =
            c == std::string_view::npos ? std::string_view{} : value.substr(c + 1);
        if (point != "shards" && point != "written" && point != "manifest" && point != "latest")
          throw bad("at:saveN:POINT needs POINT shards, written, manifest or latest");
        f.save_point = std::string(point);
        value = value.substr(0, c);
      } else if (value.starts_with("step")) {
        value.remove_prefix(4);
      }
      f.step = number(value, "at");
      if (f.step == 0)
        throw bad("steps count from 1");
      has_at = true;
    } else if (key == "kind" && !has_kind) {
      using k = fault_spec::kind;
      if (value == "abort")
        f.what = k::abort;
      else if (value == "kill")
        f.what = k::kill;
      else if (value == "exit0")
        f.what = k::exit0;
      else if (value == "exit1")
        f.what = k::exit1;
      else if (value == "throw")
        f.what = k::thrown;
      else if (value == "hang")
        f.what = k::hang;
      else if (value == "stop")
        f.what = k::stop;
      else if (value == "vanish")
        f.what = k::vanish;
      else if (value == "node")
        f.what = k::node;
      else if (value.starts_with("slow:")) {
        f.what = k::slow;
        const std::string s(value.substr(5));
        char* end = nullptr;
        f.factor = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !(f.factor >= 1.0) || f.factor > 1e3)
          throw bad("slow needs a factor between 1 and 1000, not \"" + s + "\"");
      } else
        throw bad("unknown kind \"" + std::string(value) + "\"");
      has_kind = true;
    } else
      throw bad("unknown or repeated field \"" + std::string(key) + "\"");
  }
  if (!has_rank || !has_at || !has_kind)
    throw bad(std::string("missing ") + (!has_rank ? "rank" : !has_at ? "at" : "kind"));
  return f;
}

/// The fault from HSPMD_FAULT, if set and not empty.
[[nodiscard]] inline std::optional<fault_spec> fault_from_env() {
  const char* v = std::getenv("HSPMD_FAULT");
  if (v == nullptr || *v == '\0')
    return std::nullopt;
  return parse_fault(v);
}

/// Injects `f` on `rank` at the start of `step` (1-based) and returns; `slow` returns and the
/// caller applies `f.factor`. The other kinds do not return.
inline void inject_fault(const fault_spec& f) {
  const std::string line = "HSPMD_FAULT: " + f.kind_text() + " at " + f.where();
  if (f.what != fault_spec::kind::thrown && f.what != fault_spec::kind::vanish &&
      f.what != fault_spec::kind::node) {
    std::fprintf(stderr, "[hspmd rank %d] %s\n", f.rank, line.c_str());
    std::fflush(stderr);
  }
  switch (f.what) {
  case fault_spec::kind::abort:
    std::abort();
  case fault_spec::kind::kill:
  case fault_spec::kind::vanish: // as a lost machine: not a word
  case fault_spec::kind::node:
    std::raise(SIGKILL);
    std::_Exit(137); // not reached
  case fault_spec::kind::exit0:
    std::_Exit(0);
  case fault_spec::kind::exit1:
    std::_Exit(1);
  case fault_spec::kind::thrown:
    throw std::runtime_error(line);
  case fault_spec::kind::hang:
    for (;;)
      std::this_thread::sleep_for(std::chrono::hours(1));
  case fault_spec::kind::stop:
    std::raise(SIGSTOP);
    for (;;) // continued (SIGCONT): hang on
      std::this_thread::sleep_for(std::chrono::hours(1));
  case fault_spec::kind::slow:
    return;
  }
}

} // namespace hspmd::train
