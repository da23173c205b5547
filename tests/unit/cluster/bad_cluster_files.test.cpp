// Malformed cluster files: each must give exactly one line "FILE: field PATH: reason (...)",
// never a crash or another exception type.
#include <hspmd/cluster/cluster_file.hpp>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

const std::string bad_dir = std::string(HSPMD_TEST_DATA_DIR) + "/clusters/bad/";

// The message of the config_error that `f` throws; fails the test on anything else.
std::string config_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected config_error, got another exception: " << e.what());
  }
  FAIL("expected config_error, but nothing was thrown");
  return {};
}

struct bad_case {
  const char* file;   // under tests/data/clusters/bad/, without ".json"
  const char* field;  // the PATH the message must name
  const char* reason; // a piece of the reason
};

const bad_case bad_cases[] = {
    {"empty", "<root>", "the file is empty"},
    {"whitespace", "<root>", "the file is empty"},
    {"not_json", "<root>", "invalid JSON: parse error at line 1, column 1"},
    {"truncated", "devices[0].kind", "invalid JSON"},
    {"top_level_array", "<root>", "is an array, not an object"},
    {"nan_literal", "devices[0].speed", "invalid JSON"},
    {"speed_string", "devices[0].speed", "is a string (\"fast\"), not a number"},
    {"speed_zero", "devices[0].speed", "must be > 0, got 0"},
    {"speed_negative", "devices[0].speed", "must be > 0, got -1e+12"},
    {"speed_inf_string", "devices[0].speed", "is a string (\"inf\"), not a number"},
    {"speed_overflow", "devices[0].speed", "number overflow"},
    {"speed_absurd", "devices[0].speed", "is absurdly large: 1e+30 > 1e+18"},
    {"speed_tiny", "devices[0].speed", "is absurdly small: 1e-300 < 1e+06"},
    {"bf16_speed_tiny", "devices[0].bf16_speed", "is absurdly small: 1e-310 < 1e+06"},
    {"bandwidth_tiny", "links.intra_node.bandwidth", "is absurdly small: 1e-300 < 100000"},
    {"bandwidth_denormal", "links.intra_node.bandwidth", "is absurdly small: "},
    {"speed_bool", "devices[0].speed", "is true, not a number"},
    {"missing_speed", "devices[1].speed", "missing"},
    {"missing_devices", "devices", "missing"},
    {"missing_links", "links", "missing"},
    {"devices_empty", "devices", "is empty"},
    {"device_not_object", "devices[0]", "is a string (\"gpu0\"), not an object"},
    {"duplicate_names", "devices[1].name", "duplicate device name \"gpu0\" (also at devices[0])"},
    {"duplicate_after_count", "devices[1].name", "duplicate device name \"gpu.1\""},
    {"duplicate_key", "devices[0].speed", "duplicate key \"speed\""},
    {"unknown_key", "devices[0].sped", "unknown key (expected one of name, kind, speed"},
    {"unknown_top_key", "device", "did you mean \"devices\"?"},
    {"bandwidth_zero", "links.intra_node.bandwidth", "must be > 0, got 0"},
    {"bandwidth_absurd", "links.intra_node.bandwidth", "is absurdly large"},
    {"latency_negative", "links.intra_node.latency", "must be >= 0, got -1e-06"},
    {"latency_missing", "links.intra_node.latency", "missing"},
    {"links_not_object", "links", "is a string (\"fast\"), not an object"},
    {"memory_bad_unit", "devices[0].memory", "unknown unit \"gigs\""},
    {"memory_fraction", "devices[0].memory", "must be a whole number, got 1.5"},
    {"memory_absurd", "devices[0].memory", "is absurdly large"},
    {"memory_null", "devices[0].memory", "is null, not a number"},
    {"memory_negative_string", "devices[0].memory", "must be > 0"},
    {"node_negative", "devices[0].node", "must be >= 0, got -1"},
    {"node_fraction", "devices[0].node", "must be a whole number, got 0.5"},
    {"slowdown_below_one", "devices[0].slowdown", "must be >= 1, got 0.5"},
    {"count_zero", "devices[0].count", "must be >= 1, got 0"},
    {"count_name_too_long", "devices[0].name", "with count 16 the expanded names"},
    {"missing_inter_node", "links.inter_node", "missing, but the devices span 2 nodes"},
    {"name_with_space", "devices[0].name", "has the character ' '"},
    {"kind_empty", "devices[0].kind", "is empty"},
    {"version_2", "version", "unsupported version 2"},
    {"trailing_garbage", "<root>", "invalid JSON"},
    {"invalid_utf8", "name", "ill-formed UTF-8"},
    {"collectives_unknown_algorithm", "collectives.all_gather_v.ring",
     "unknown key (expected one of padded, grouped, native)"},
    {"collectives_negative_alpha", "collectives.all_reduce.alpha", "must be >= 0, got -1e-06"},
    {"overlap_above_one", "overlap", "is absurdly large: 1.5 > 1"},
};

} // namespace

TEST_CASE("every malformed cluster file gives one line naming the file and the field") {
  STATIC_REQUIRE(std::size(bad_cases) >= 20);
  for (const bad_case& c : bad_cases) {
    const std::string file = bad_dir + c.file + ".json";
    const std::string msg = config_error_of([&] { (void)load_cluster(file); });
    CAPTURE(file, msg);
    CHECK(msg.rfind(file + ": field " + c.field + ": ", 0) == 0);
    CHECK(msg.find(c.reason) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find("(expected ") != std::string::npos);
    for (char ch : msg) // printable ASCII only, whatever bytes the file held
      CHECK((ch >= 0x20 && ch < 0x7f));
  }
}

TEST_CASE("every file in the bad folder is covered by the table above") {
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(bad_dir)) {
    const std::string stem = entry.path().stem().string();
    const bool listed = std::any_of(std::begin(bad_cases), std::end(bad_cases),
                                    [&](const bad_case& c) { return stem == c.file; });
    CAPTURE(stem);
    CHECK(listed);
    ++files;
  }
  CHECK(files == std::size(bad_cases));
}

TEST_CASE("unreadable paths and a rank count that differs from the device count") {
  CHECK(config_error_of([] { (void)load_cluster("/nonexistent/c.json"); }) ==
        "/nonexistent/c.json: cannot read: no such file (check the path)");
  CHECK(config_error_of([] {
          (void)load_cluster(HSPMD_TEST_DATA_DIR);
        }).find("cannot read: it is a directory") != std::string::npos);

  const cluster c = load_cluster(std::string(HSPMD_SOURCE_DIR) + "/clusters/emulated-2.json");
  CHECK_NOTHROW(check_rank_count(c, 2));
  const std::string msg = config_error_of([&] { check_rank_count(c, 3); });
  CHECK(msg.find("emulated-2.json: field devices: describes 2 device(s) but the job has 3 rank(s) "
                 "(expected one device per rank: launch with -np 2") != std::string::npos);
}

namespace {
// Every leaf of `j` with its path in the error-message spelling.
void leaves(const nlohmann::json& j, const std::string& path,
            std::vector<std::pair<std::string, nlohmann::json::json_pointer>>& out,
            const nlohmann::json::json_pointer& ptr) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items())
      leaves(v, path.empty() ? k : path + "." + k, out, ptr / k);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i)
      leaves(j[i], path + "[" + std::to_string(i) + "]", out, ptr / i);
  } else {
    out.emplace_back(path, ptr);
  }
}
} // namespace

TEST_CASE("replacing any field of a valid file by a wrong value names that field") {
  const std::string base_file = std::string(HSPMD_SOURCE_DIR) + "/clusters/emulated-3.json";
  const nlohmann::json base = nlohmann::json::parse(io::read_text_file(base_file));
  std::vector<std::pair<std::string, nlohmann::json::json_pointer>> all;
  leaves(base, "", all, nlohmann::json::json_pointer());
  REQUIRE(all.size() > 15);
  const nlohmann::json wrong_values[] = {
      "x", -1, 0, nullptr, true, nlohmann::json::array(), nlohmann::json::object(), 1e300, 0.5, ""};
  int rejected = 0;
  for (const auto& [path, ptr] : all) {
    for (const auto& wrong : wrong_values) {
      nlohmann::json doc = base;
      doc[ptr] = wrong;
      CAPTURE(path, wrong.dump());
      try {
        (void)parse_cluster(doc.dump(), "m.json");
      } catch (const config_error& e) {
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.rfind("m.json: field " + path, 0) == 0);
        CHECK(msg.find('\n') == std::string::npos);
        ++rejected;
      } // any other exception type escapes and fails the test
    }
    // Deleting a required field names it; deleting an optional one is fine.
    nlohmann::json doc = base;
    doc[ptr.parent_pointer()].erase(ptr.back());
    try {
      (void)parse_cluster(doc.dump(), "m.json");
    } catch (const config_error& e) {
      CHECK(std::string(e.what()).rfind("m.json: field " + path + ": missing", 0) == 0);
    }
  }
  CHECK(rejected > 100);
}

TEST_CASE("every prefix of a valid file is rejected cleanly") {
  const std::string text =
      io::read_text_file(std::string(HSPMD_SOURCE_DIR) + "/clusters/hap-testbed.json");
  for (std::size_t n = 0; n + 1 < text.size(); n += 7) {
    CAPTURE(n);
    const std::string msg =
        config_error_of([&] { (void)parse_cluster(text.substr(0, n), "p.json"); });
    CHECK(msg.rfind("p.json: field ", 0) == 0);
  }
}
