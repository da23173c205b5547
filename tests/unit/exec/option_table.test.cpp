// The trainer's option table: every numeric option refused outside its range, by the flag
// parser (on its text, before a negative count wraps) and by the trainer's check (whichever way
// the value arrived), each with one line naming the option and its range.
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/run_meta.hpp>
#include <hspmd/train/train_flags.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

using namespace hspmd;

namespace {
// Parses `flag value` into fresh options; the CLI11 error text, or "" when accepted.
std::string parse(const std::string& flag, const std::string& value, train::train_options& o) {
  CLI::App app{"test"};
  train::add_train_flags(app, o);
  std::vector<std::string> args{value, flag}; // CLI11 reads a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return {};
}
} // namespace

TEST_CASE("every row of the option table: its default inside, absurd values refused with the "
          "flag and the range") {
  const train::train_options defaults;
  CHECK_NOTHROW(train::check_train_options(defaults));
  REQUIRE(train::train_option_table().size() >= 30);
  for (const train::train_option& row : train::train_option_table()) {
    const std::string flag(row.flag);
    INFO(flag);
    if (!row.numeric())
      continue;
    CHECK(row.in_range(row.number(defaults)));
    const bool count = std::holds_alternative<train::train_option::count_ref>(row.value);
    // The flag parser, on the text.
    std::vector<std::string> absurd = {"-1", "1e30", "inf", "nan", "seven"};
    if (!count)
      absurd.push_back("-0.5");
    for (const std::string& v : absurd) {
      train::train_options o;
      const std::string error = parse(flag, v, o);
      INFO(v << " -> " << error);
      CHECK(error.find(flag) != std::string::npos);
      CHECK_FALSE(error.empty());
    }
    train::train_options ok;
    CHECK(parse(flag, row.text(defaults), ok).empty());
    // The trainer's check, on a value set in code: a wrapped negative count, or a non-finite
    // real.
    train::train_options o;
    if (const auto* ref = std::get_if<train::train_option::count_ref>(&row.value))
      (*ref)(o) = static_cast<std::size_t>(-1); // what "-1" became before the table
    else
      (*std::get<train::train_option::real_ref>(row.value))(o) =
          std::numeric_limits<double>::infinity();
    if (flag == "--seed") { // every 64-bit seed is a seed
      CHECK_NOTHROW(train::check_train_options(o));
      continue;
    }
    CHECK_THROWS_WITH(train::check_train_options(o),
                      Catch::StartsWith(flag.substr(2) + " ") &&
                          Catch::Contains("give " + flag + " a value in " + row.range()));
  }
}

TEST_CASE("the held-out command lines are refused at start, naming the flag and its range") {
  train::train_options o;
  CHECK_THAT(parse("--steps", "-1", o), Catch::Contains("--steps: value -1 is outside [0, 1e+12]"));
  CHECK_THAT(parse("--steps", "99999999999999999999999", o), Catch::Contains("is outside"));
  CHECK_THAT(parse("--lr", "inf", o), Catch::Contains("--lr: value inf is outside (0, 1e+06]"));
  CHECK_THAT(parse("--accumulate", "4000000000", o), Catch::Contains("is outside [1, 1e+06]"));
  CHECK_THAT(parse("--batch", "0", o), Catch::Contains("--batch: value 0 is outside [1, 1e+09]"));
  CHECK(parse("--lr", "0.01", o).empty());
  CHECK(o.lr.peak == 0.01);
  // The agreed options name every row that must agree, by its flag's name.
  const auto agreed = train::agreed_train_options(o);
  CHECK(agreed.front().first == "steps");
  CHECK(std::ranges::none_of(agreed, [](const auto& p) { return p.first == "log-every"; }));
}

TEST_CASE("a failed allocation ends with a line that says so and gives the fix") {
  CHECK_THAT(error_line(std::bad_alloc()),
             Catch::StartsWith("out of memory: an allocation failed (std::bad_alloc)") &&
                 Catch::Contains("smaller batch"));
  CHECK(error_line(config_error("a", "b", "c")) == "a: b (c)");
  CHECK(io::report_errors([]() -> int { throw std::bad_alloc(); }) == 1);
}

TEST_CASE("every option is a flag, and the table decides the one-process refusals and the "
          "agreement") {
  // Each row's flag parses; a switch sets, a tristate has --no-, a choice refuses other words.
  for (const train::train_option& row : train::train_option_table()) {
    const std::string flag(row.flag);
    INFO(flag);
    CLI::App app{"test"};
    train::train_options o;
    train::add_train_flags(app, o);
    CHECK(app.get_option_no_throw(flag) != nullptr);
  }
  train::train_options o;
  {
    CLI::App app{"test"};
    train::add_train_flags(app, o);
    std::vector<std::string> args{"--no-calibrate", "--recompute", "bf16",   "--precision",
                                  "cosine",         "--schedule",  "--quiet"};
    app.parse(args);
  }
  CHECK(o.calibrate == std::optional<bool>(false));
  CHECK(o.recompute);
  CHECK(o.precision == exec::precision::bf16);
  CHECK(o.lr.shape == train::lr_schedule::kind::cosine);
  CHECK(o.out == nullptr);
  train::train_options fresh;
  CHECK_THAT(parse("--precision", "fp8", fresh),
             Catch::Contains("--precision: fp8 is not f32, bf16 or f16"));
  CHECK_THAT(parse("--schedule", "linear", fresh), Catch::Contains("is not constant or cosine"));

  // One process: each option that needs a cluster, set, is refused naming it.
  for (const train::train_option& row : train::train_option_table()) {
    if (!row.needs_cluster)
      continue;
    const std::string flag(row.flag);
    INFO(flag);
    train::train_options x;
    const bool text = std::holds_alternative<train::train_option::text_ref>(row.value);
    std::string error = parse(flag, text ? "tp" : "1.5", x);
    if (!error.empty()) // a flag without a value
      error = parse(flag, "", x);
    CHECK(row.is_set(x));
    CHECK_NOTHROW(train::check_train_options(x, true));
    CHECK_THROWS_WITH(train::check_train_options(x, false),
                      Catch::StartsWith(row.name()) && Catch::Contains("needs a cluster"));
  }

  // Agreement: values, or only whether an output file is named.
  train::train_options a;
  train::train_options b;
  a.trace = "rank0.json";
  b.trace = "elsewhere.json";
  a.lr.peak = 0.5;
  const auto x = train::agreed_train_options(a);
  const auto y = train::agreed_train_options(b);
  REQUIRE(x.size() == y.size());
  std::vector<std::string> differ;
  for (std::size_t k = 0; k < x.size(); ++k)
    if (x[k] != y[k])
      differ.push_back(x[k].first);
  CHECK(differ == std::vector<std::string>{"lr"});
  const auto trace = std::ranges::find_if(x, [](const auto& p) { return p.first == "trace"; });
  REQUIRE(trace != x.end());
  CHECK(trace->second == "on");
}

TEST_CASE("a checkpoint's manifest records every option the ranks agree on, from the table") {
  train::train_options o;
  o.steps = 7;
  o.lr = train::lr_schedule::cosine(2e-3, 3);
  o.bucket_mb = 2.5;
  o.plan = "dp-cp";
  graph::graph g;
  const auto meta = train::checkpoint_meta(synth::graph_hash(g), o, nullptr,
                                           nlohmann::json::object(), 3, nullptr);
  std::size_t rows = 0;
  for (const train::train_option& row : train::train_option_table()) {
    const std::string name = row.name();
    INFO(name);
    if (row.agree != train::train_option::agreement::value) {
      CHECK_FALSE(meta["options"].contains(name));
      continue;
    }
    ++rows;
    REQUIRE(meta["options"].contains(name));
    CHECK(meta["options"][name] == row.text(o));
  }
  CHECK(meta["options"].size() == rows);
  CHECK(meta["options"]["steps"] == "7");
  CHECK(meta["options"]["plan"] == "dp-cp");
}
