#pragma once
// Parsing a CLI11 command line the way every hspmd program does: a bad flag is one line on stderr
// with a suggestion for a typo ("unknown argument --stpes (did you mean --steps?)") and exit
// code 2. CLI11 is the caller's dependency: include this header only where CLI11 is linked.

#include <hspmd/core/error.hpp>
#include <hspmd/io/json_input.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

namespace hspmd::io {

/// A count flag that must be 1 or more ("--batch 0" is refused with the fix).
inline const CLI::Validator at_least_one(
    [](std::string& value) -> std::string {
      if (value.find_first_not_of("0123456789") == std::string::npos && !value.empty() &&
          value.find_first_not_of('0') != std::string::npos)
        return {};
      return "value " + value + " is not allowed: give a whole number of 1 or more";
    },
    "COUNT >= 1");

/// The flag of `app` closest to `typed`, if it is close (a typo).
[[nodiscard]] inline std::optional<std::string> closest_flag(const CLI::App& app,
                                                             std::string_view typed) {
  std::optional<std::string> best;
  std::size_t best_distance = 3; // at most 2 edits away
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& name : opt->get_lnames()) {
      const std::string flag = "--" + name;
      const std::size_t d = io::edit_distance(flag, typed.substr(0, typed.find('=')));
      if (d < best_distance) {
        best_distance = d;
        best = flag;
      }
    }
  return best;
}

/// Parses the command line. Returns an exit code when the program should stop (0 after
/// --help; 2 for a bad flag, reported in one line with a suggestion for a typo), nothing when
/// it should go on.
[[nodiscard]] inline std::optional<int> parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    std::string line = "error: unknown argument";
    const auto extras = app.remaining();
    for (const std::string& extra : extras) {
      if (extra.rfind('-', 0) != 0 && extras.front().rfind('-', 0) == 0)
        continue; // the value of an unknown flag
      line += " " + extra;
      if (const auto near = closest_flag(app, extra); near && extra.rfind('-', 0) == 0)
        line += " (did you mean " + *near + "?)";
    }
    std::fprintf(stderr, "%s; see --help\n", line.c_str());
    (void)e;
    return 2;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s; see --help\n", e.what());
    return 2;
  }
  return std::nullopt;
}

/// Runs `body` (which returns the exit code); an exception becomes one line "error: what()" on
/// stderr and exit code 1, instead of std::terminate's report.
template <class F>
int report_errors(F&& body) noexcept {
  try {
    return static_cast<F&&>(body)();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", error_line(e).c_str());
  } catch (...) {
    std::fprintf(stderr, "error: unknown exception\n");
  }
  return 1;
}

} // namespace hspmd::io
