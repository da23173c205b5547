#include <hspmd/core/error.hpp>
#include <hspmd/core/parallel.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <string>
#include <vector>

using namespace hspmd;

TEST_CASE("error messages are one line: where, reason, fix") {
  const config_error e("a.json: field devices[1].speed", "must be > 0, got -3",
                       "expected flop/s > 0");
  CHECK(std::string(e.what()) ==
        "a.json: field devices[1].speed: must be > 0, got -3 (expected flop/s > 0)");
  CHECK(e.where() == "a.json: field devices[1].speed");
  CHECK(e.reason() == "must be > 0, got -3");
  CHECK(e.fix() == "expected flop/s > 0");

  const error no_fix("somewhere", "broke");
  CHECK(std::string(no_fix.what()) == "somewhere: broke");

  const error multi("a\nb", "c\r\nd", "e\nf");
  CHECK(std::string(multi.what()).find('\n') == std::string::npos);
  CHECK(std::string(multi.what()).find('\r') == std::string::npos);
}

TEST_CASE("comm_error names the rank and the call") {
  const comm_error e(2, "MPI_Allgatherv", "MPI_ERR_COUNT: invalid count argument");
  CHECK(e.rank() == 2);
  CHECK(std::string(e.what()) == "rank 2: MPI_Allgatherv: MPI_ERR_COUNT: invalid count argument");
}

TEST_CASE("every hspmd exception is an hspmd::error and a std::exception") {
  CHECK_THROWS_AS(throw config_error("f", "r"), error);
  CHECK_THROWS_AS(throw shape_error("f", "r"), error);
  CHECK_THROWS_AS(throw plan_error("f", "r"), error);
  CHECK_THROWS_AS(throw comm_error(0, "c", "r"), std::exception);
}

TEST_CASE("parallel_for runs every item once and rethrows the first failing item's error, as a "
          "loop in order would, after every item ran") {
  for (std::size_t threads : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{64}}) {
    CAPTURE(threads);
    std::vector<std::atomic<int>> runs(40);
    CHECK_THROWS_WITH(parallel_for(runs.size(), threads,
                                   [&](std::size_t i) {
                                     ++runs[i];
                                     if (i == 7 || i == 31)
                                       throw config_error("item " + std::to_string(i), "failed");
                                   }),
                      "item 7: failed");
    for (const std::atomic<int>& r : runs)
      CHECK(r.load() == 1);
  }
  parallel_for(0, 2, [](std::size_t) { FAIL("no item to run"); });
}
