#include <hspmd/core/extents.hpp>
#include <hspmd/core/placement.hpp>

#include <catch2/catch.hpp>

#include <string>

using namespace hspmd;

TEST_CASE("placement types map to descriptors") {
  STATIC_REQUIRE(placement_of<replicated>.is_replicated());
  STATIC_REQUIRE(placement_of<partial>.is_partial());
  STATIC_REQUIRE(placement_of<split<2>>.is_split());
  STATIC_REQUIRE(placement_of<split<2>>.dim() == 2);
  STATIC_REQUIRE(placement_of<split<2>> == placement::split_along(2));
  STATIC_REQUIRE_FALSE(placement_of<split<1>> == placement_of<split<2>>);
  STATIC_REQUIRE_FALSE(placement_of<replicated> == placement_of<partial>);
  STATIC_REQUIRE(placement_type<split<0>>);
  STATIC_REQUIRE_FALSE(placement_type<int>);
  STATIC_REQUIRE(placement_fits_v<split<1>, extents<4, 4>>);
  STATIC_REQUIRE(placement_fits_v<partial, extents<4>>);
}

TEST_CASE("placement descriptors round-trip through their text form") {
  for (const placement p : {placement{replicated{}}, placement{partial{}},
                            placement::split_along(0), placement::split_along(13)}) {
    CAPTURE(p.to_string());
    CHECK(placement::parse(p.to_string()) == p);
  }
  CHECK(placement::split_along(3).to_string() == "split(3)");
  for (const char* bad :
       {"", "split", "split()", "split(x)", "split(1", "split(-1)", "Replicated", "split(1)x"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(placement::parse(bad, "plan.json: field p"), config_error);
  }
  CHECK_THROWS_WITH(placement::parse("sideways", "plan.json: field ops[2].out"),
                    "plan.json: field ops[2].out: unknown placement \"sideways\" (expected "
                    "\"replicated\", \"partial\" or \"split(D)\" with D a dimension)");
}
