#pragma once
// Command-line flags for the library trainer's options, on a CLI11 app (CLI11 is the caller's
// dependency: include this header only in a program that links CLI11).
//
//     CLI::App app{"my trainer"};
//     train::train_options o;                 // defaults the flags show in --help
//     train::add_train_flags(app, o);
//     app.add_option("--hidden", hidden, "hidden width")->capture_default_str();
//     if (const auto rc = exec::parse_flags(app, argc, argv))
//       return *rc;                          // --help, or a bad flag (io/cli.hpp)

#include <hspmd/io/cli.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/trainer.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace hspmd::train {

using io::parse_flags;
using io::report_errors;

using io::at_least_one;

/// The range check of an option of the table, on the flag's text before it is converted (so
/// "-1" is refused, not wrapped to 2^64 - 1).
[[nodiscard]] inline CLI::Validator in_range_of(const train_option& row) {
  return {[row](std::string& value) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(value.c_str(), &end);
            if (end != value.c_str() && *end == '\0' && row.in_range(v))
              return {};
            return "value " + value + " is outside " + row.range() + ": give a number in it";
          },
          row.range()};
}

/// Adds every trainer flag to `app`, writing into `o` (whose values are shown as defaults): one
/// per row of the option table (train/option_table.hpp), numbers checked against their range on
/// their text, choices against their words; a tristate option gets `--name` and `--no-name`.
inline void add_train_flags(CLI::App& app, train_options& o) {
  for (const train_option& row : train_option_table()) {
    const std::string flag(row.flag);
    const std::string help(row.help);
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, train_option::count_ref> ||
                        std::is_same_v<V, train_option::real_ref>)
            app.add_option(flag, v(o), help)->capture_default_str()->check(in_range_of(row));
          else if constexpr (std::is_same_v<V, train_option::text_ref>)
            app.add_option(flag, v(o), help)->capture_default_str();
          else if constexpr (std::is_same_v<V, train_option::switch_ref>)
            app.add_flag(flag, v(o), help);
          else if constexpr (std::is_same_v<V, train_option::tristate_ref>) {
            app.add_flag_callback(
                flag, [&o, v] { v(o) = true; }, help);
            app.add_flag_callback(
                "--no-" + row.name(), [&o, v] { v(o) = false; }, "the opposite of " + flag);
          } else if constexpr (std::is_same_v<V, train_option::choice>) {
            std::vector<std::string> words;
            for (std::size_t at = 0; at <= v.allowed.size();) {
              const std::size_t bar = std::min(v.allowed.find('|', at), v.allowed.size());
              words.emplace_back(v.allowed.substr(at, bar - at));
              at = bar + 1;
            }
            std::string listed;
            for (std::size_t k = 0; k < words.size(); ++k)
              listed += (k == 0 ? "" : k + 1 == words.size() ? " or " : ", ") + words[k];
            app.add_option_function<std::string>(
                   flag,
                   [&o, v, flag, words, listed](const std::string& text) {
                     if (std::find(words.begin(), words.end(), text) == words.end())
                       throw CLI::ValidationError(flag, text + " is not " + listed +
                                                            " (give one of them)");
                     v.set(o, text);
                   },
                   help)
                ->default_str(v.get(o));
          } else {
            app.add_flag_callback(
                flag, [&o, v] { v.apply(o); }, help);
          }
        },
        row.value);
  }
}

} // namespace hspmd::train
