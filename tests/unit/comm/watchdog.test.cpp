// The watchdog's timeout parsing and report, and HSPMD_FAULT's parsing (the MPI runs in
// tests/CMakeLists.txt show both ending real jobs).
#include <hspmd/comm/watchdog.hpp>
#include <hspmd/train/fault.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace hspmd;

TEST_CASE("HSPMD_TIMEOUT values: seconds, 0 or off for none, anything else refused") {
  CHECK(parse_timeout("300", "t") == 300.0);
  CHECK(parse_timeout("2.5s", "t") == 2.5);
  CHECK(parse_timeout("0", "t") == 0.0);
  CHECK(parse_timeout("off", "t") == 0.0);
  for (const char* bad : {"", "soon", "-1", "5 s", "1e7", "nan", "inf", "3x", "s"})
    CHECK_THROWS_WITH(parse_timeout(bad, "environment variable HSPMD_TIMEOUT"),
                      Catch::Contains("environment variable HSPMD_TIMEOUT") &&
                          Catch::Contains("is not a timeout") &&
                          Catch::Contains("give seconds between 0 and 1e6"));
}

TEST_CASE("the watchdog reports the call, its phase and the last completed call") {
  collective_watchdog w(3, 100.0);
  CHECK(w.report().empty()); // not waiting
  pending_call first;
  first.call =
      fingerprint_of<double>(6, collective::broadcast, 4, {}, 0, -1, uneven_algorithm::native);
  { const auto s = w.watch(first); }
  w.set_phase("training step 5");
  pending_call second;
  second.call =
      fingerprint_of<float>(7, collective::all_reduce, 4096, {}, -1, 0, uneven_algorithm::native);
  const auto s = w.watch(second);
  const std::string r = w.report();
  CHECK_THAT(r, Catch::StartsWith("rank 3: all_reduce #7 (f32, 4096 elements, sum) in training "
                                  "step 5 has not completed after 0.0 s (HSPMD_TIMEOUT=100); the "
                                  "last call completed here: broadcast #6 (f64, 4 elements, root "
                                  "0)"));
  CHECK_THAT(r, Catch::Contains("has not arrived"));
  pending_call p2p;
  p2p.point_to_point = "receive from";
  p2p.peer = 2;
  p2p.tag = 7;
  CHECK(describe(p2p) == "receive from rank 2 (tag 7)");
}

TEST_CASE("the ranks of this host that left no marker of a wait are the ones not arrived") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "hspmd-watchdog-markers-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (int r : {0, 1, 2, 3}) // rank 4 runs on another host: no host marker here
    std::ofstream(dir / ("host-r" + std::to_string(r)));
  for (int r : {0, 2})
    std::ofstream(dir / ("wait-abc-7-r" + std::to_string(r)));
  std::ofstream(dir / "wait-abc-6-r3"); // an earlier call's marker does not count
  std::size_t unseen = 0;
  CHECK(not_arrived(dir, "wait-abc-7", {0, 1, 2, 3, 4}, &unseen) == std::vector<int>{1, 3});
  CHECK(unseen == 1);
  CHECK(not_arrived(dir, "wait-abc-7", {0, 2}).empty());
  fs::remove_all(dir);
}

TEST_CASE("a watchdog of timeout 0 watches nothing") {
  collective_watchdog w(0, 0.0);
  const auto s = w.watch(pending_call{});
  CHECK(w.report().empty());
  CHECK(w.timeout() == 0.0);
}

TEST_CASE("HSPMD_FAULT: rank, step and kind, in any order, bad specs named") {
  using k = train::fault_spec::kind;
  auto f = train::parse_fault("rank:1,at:step5,kind:hang");
  CHECK(f.rank == 1);
  CHECK(f.step == 5);
  CHECK(f.what == k::hang);
  f = train::parse_fault("kind:slow:3,at:7,rank:0");
  CHECK(f.what == k::slow);
  CHECK(f.factor == 3.0);
  CHECK(f.step == 7);
  CHECK(f.kind_text() == "slow:3");
  for (const char* kind : {"abort", "kill", "exit0", "exit1", "throw", "hang", "stop"})
    CHECK(train::parse_fault(std::string("rank:2,at:step1,kind:") + kind).kind_text() == kind);
  const auto refused = [](const char* spec, const char* why) {
    CHECK_THROWS_WITH(train::parse_fault(spec),
                      Catch::Contains(std::string("HSPMD_FAULT=") + spec) && Catch::Contains(why) &&
                          Catch::Contains("write rank:R,at:stepN,kind:K"));
  };
  refused("rank:1,at:step3", "missing kind");
  refused("rank:1,kind:hang", "missing at");
  refused("rank:1,at:step0,kind:hang", "steps count from 1");
  refused("rank:x,at:step3,kind:hang", "rank needs a whole number");
  refused("rank:1,at:step3,kind:explode", "unknown kind \"explode\"");
  refused("rank:1,at:step3,kind:slow:0.5", "slow needs a factor between 1 and 1000");
  refused("rank:1,rank:2,at:step3,kind:hang", "unknown or repeated field \"rank\"");
  refused("rank1,at:step3,kind:hang", "is not field:value");
}
