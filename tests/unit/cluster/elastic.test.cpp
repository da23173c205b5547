// The elastic launcher's reading of a failed job (train/elastic.hpp): which ranks it lost, from
// lines as Open MPI 4.1 and hspmd print them, and the cluster that remains.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/train/elastic.hpp>
#include <hspmd/train/ram_cadence.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace hspmd;

TEST_CASE("a failed job's lines name the ranks it lost, the strongest evidence first") {
  // A rank's own fault line and Open MPI's signal line.
  auto l = train::attribute(
      {"checkpoint after step 5: ck/step-00000005 (8 ms)",
       "[hspmd rank 1] HSPMD_FAULT: kill at step 6",
       "mpiexec noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."});
  CHECK(l.definite);
  REQUIRE(l.ranks.size() == 1);
  CHECK(l.ranks.at(1) == "HSPMD_FAULT: kill at step 6");
  // Open MPI alone names a rank killed by a signal.
  l = train::attribute({"mpirun noticed that process rank 2 with PID 4711 on node n3 exited on "
                        "signal 9 (Killed)."});
  REQUIRE(l.ranks.size() == 1);
  CHECK(l.ranks.at(2) == "killed by signal 9");
  // The watchdog names who did not arrive; the waiting ranks in its prefix are alive.
  l = train::attribute(
      {"[hspmd rank 0] barrier #643 in training step 4 has not completed after 3.1 s "
       "(HSPMD_TIMEOUT=3); the last call completed here: all_reduce #642 (...); not arrived: "
       "ranks 1, 3",
       "[hspmd rank 2] barrier #643 in training step 4 has not completed after 3.1 s; not "
       "arrived: ranks 1, 3"});
  CHECK(l.definite);
  CHECK(l.ranks.size() == 2);
  CHECK(l.ranks.count(1) == 1);
  CHECK(l.ranks.count(3) == 1);
  CHECK(l.ranks.count(0) == 0);
  // Without those: the first process that exited non-zero, MPI_Abort, a rank's error line.
  l = train::attribute({"mpiexec detected that one or more processes exited with non-zero status,",
                        "  Process name: [[4811,1],2]", "  Exit code:    1"});
  CHECK_FALSE(l.definite);
  REQUIRE(l.ranks.size() == 1);
  CHECK(l.ranks.at(2) == "exited with status 1");
  l = train::attribute({"[hspmd rank 0] bert: out of memory on cpu0",
                        "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD"});
  REQUIRE(l.ranks.size() == 1);
  CHECK(l.ranks.at(0) == "bert: out of memory on cpu0");
  CHECK(train::attribute({"loss 1.2", "done"}).ranks.empty());
}

TEST_CASE("the cluster that remains drops the lost ranks' devices and measured collectives") {
  const cluster c = parse_cluster(R"({"version": 1, "name": "three",
      "links": {"intra_node": {"bandwidth": 5e9, "latency": 1e-6}},
      "devices": [{"name": "a", "kind": "cpu", "speed": 5e10, "memory": "4 GiB"},
                  {"name": "b", "kind": "cpu", "speed": 3e10, "memory": "4 GiB"},
                  {"name": "c", "kind": "cpu", "speed": 1e10, "memory": "4 GiB"}]})",
                                  "three.json");
  const cluster r = train::remaining_cluster(c, {1}, 1, "three");
  CHECK(train::device_list(r) == "a, c");
  CHECK(r.name == "three-gen1");
  CHECK(r.devices[1].speed == 1e10);
  CHECK_THROWS_WITH(train::remaining_cluster(c, {0, 1, 2}, 1, "three"),
                    Catch::Contains("leaves no device"));
  CHECK_THROWS_WITH(train::remaining_cluster(c, {5}, 1, "three"),
                    Catch::Contains("lost rank 5: is not a rank of the job's 3 devices"));
  // What remains is a valid cluster file again.
  CHECK(parse_cluster(to_json(r).dump(), "gen1.json") == r);
}

TEST_CASE("the launcher follows a metrics file's last step, reading only what was appended") {
  const std::string path =
      (std::filesystem::temp_directory_path() / "hspmd-step-follower.jsonl").string();
  std::filesystem::remove(path);
  train::step_follower follow(path);
  CHECK(follow() == 0); // no file yet
  std::ofstream(path) << R"({"event":"start","ranks":3})"
                      << "\n"
                      << R"({"step":1,"loss":2.0})"
                      << "\n";
  CHECK(follow() == 1);
  std::ofstream(path, std::ios::app) << R"({"step":2,"loss":1.9})"
                                     << "\n"
                                     << R"({"step":3,"lo)";
  CHECK(follow() == 2); // the half-written line waits
  std::ofstream(path, std::ios::app) << R"(ss":1.8})"
                                     << "\n"
                                     << R"({"event":"stopped"})"
                                     << "\n";
  CHECK(follow() == 3);
  CHECK(train::last_step(path) == 3);
  std::ofstream(path) << R"({"step":1,"loss":2.0})"
                      << "\n"; // a new run's, shorter
  CHECK(follow() == 1);
  std::filesystem::remove(path);
}

TEST_CASE("the RAM budget measures a save's cost on the run and keeps the state as often as fits") {
  // 40 steps: 2 warm-up, 5 without saves (100 ms), saves after steps 8..12, and the steps after
  // them cost 15 ms more: a 15 % save within 5 % is every 3rd step.
  train::ram_cadence c(0.05, 1, 40);
  REQUIRE_FALSE(c.decided());
  std::vector<std::size_t> saved;
  bool decided_at_13 = false;
  for (std::size_t done = 1; done <= 40; ++done) {
    const bool after_save = !saved.empty() && saved.back() == done - 1;
    if (c.measure(done, after_save ? 0.115 : (done == 1 ? 0.5 : 0.100))) {
      CHECK(done == 13);
      decided_at_13 = true;
      CHECK(c.proposal() == 3);
      c.decide(c.proposal());
    }
    if (c.save_after(done))
      saved.push_back(done);
  }
  CHECK(decided_at_13);
  CHECK(c.every() == 3);
  CHECK(c.save_cost() == Approx(0.015));
  CHECK(c.step_seconds() == Approx(0.1));
  // The measured saves, then every 3rd step: nothing kept during warm-up and the baseline.
  const std::vector<std::size_t> want = {8, 9, 10, 11, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39};
  CHECK(saved == want);

  // A save that costs nothing measurable keeps every step; noise below the baseline too.
  train::ram_cadence cheap(0.05, 1, 40);
  for (std::size_t done = 1; done <= 13; ++done)
    (void)cheap.measure(done, done > 8 ? 0.099 : 0.1);
  CHECK(cheap.proposal() == 1);

  // Off (budget 0), a short run, or a resumed run's own steps counted from where it resumed.
  train::ram_cadence off(0.0, 4, 40);
  CHECK(off.decided());
  CHECK(off.save_after(8));
  CHECK_FALSE(off.save_after(9));
  CHECK(train::ram_cadence(0.05, 2, 17).decided());
  train::ram_cadence resumed(0.05, 1, 60, 30);
  CHECK_FALSE(resumed.decided());
  CHECK_FALSE(resumed.save_after(37));
  CHECK(resumed.save_after(38));
  CHECK_FALSE(resumed.measure(42, 0.1));
  CHECK(resumed.measure(43, 0.1));
}
