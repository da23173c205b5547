#include <hspmd/comm/debug.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

using namespace hspmd;

TEST_CASE("fingerprints describe the call and name both sides of a mismatch") {
  call_fingerprint a;
  a.sequence = 4;
  a.op = static_cast<std::uint64_t>(collective::all_gather_v);
  a.element = 0;
  a.count = 10;
  const std::vector<std::size_t> counts{7, 3};
  a.counts_hash = hash_counts(counts);
  a.algorithm = static_cast<std::uint64_t>(uneven_algorithm::padded);
  const std::string d = describe(a);
  CHECK_THAT(d, Catch::StartsWith("all_gather_v #4 (f32, 10 elements, counts hash "));
  CHECK_THAT(d, Catch::EndsWith(", padded)"));

  call_fingerprint b = a;
  const std::vector<std::size_t> other{6, 4};
  b.counts_hash = hash_counts(other);
  CHECK(a.counts_hash != b.counts_hash);
  const std::vector<call_fingerprint> same{a, a, a};
  CHECK_NOTHROW(check_fingerprints(same, 1));
  const std::vector<call_fingerprint> differ{a, a, b};
  try {
    check_fingerprints(differ, 1);
    FAIL("no mismatch reported");
  } catch (const comm_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::StartsWith("rank 1: collective mismatch (HSPMD_DEBUG=detail): rank 0 "
                                      "called " +
                                      describe(a) + " but rank 2 called " + describe(b)));
  }
  CHECK(call_fingerprint::from_words(a.words()) == a);
}

TEST_CASE("HSPMD_DEBUG is read strictly") {
  ::unsetenv("HSPMD_DEBUG");
  CHECK_FALSE(debug_collectives_from_env());
  ::setenv("HSPMD_DEBUG", "off", 1);
  CHECK_FALSE(debug_collectives_from_env());
  ::setenv("HSPMD_DEBUG", "detail", 1);
  CHECK(debug_collectives_from_env());
  ::setenv("HSPMD_DEBUG", "verbose", 1);
  CHECK_THROWS_WITH(debug_collectives_from_env(),
                    "environment variable HSPMD_DEBUG: unknown value \"verbose\" (expected \"off\" "
                    "or \"detail\")");
  ::unsetenv("HSPMD_DEBUG");
}
