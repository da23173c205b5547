// Dynamic loss scaling: growth after clean steps, backoff and a skipped step on overflow, the
// bounds, bad settings named; and why it exists, with the real float16 type: a gradient that
// flushes to zero unscaled survives scaled, and one that overflows makes the scale back off.
#include <hspmd/core/half.hpp>
#include <hspmd/train/loss_scale.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <string>

using namespace hspmd;

TEST_CASE("dynamic_loss_scale grows after clean steps and backs off on overflow") {
  train::loss_scale_options o;
  o.growth_interval = 3;
  train::dynamic_loss_scale ls(o);
  CHECK(ls.scale() == 65536.0);
  CHECK(ls.update(false));
  CHECK(ls.update(false));
  CHECK(ls.scale() == 65536.0);
  CHECK(ls.update(false)); // the third clean step in a row
  CHECK(ls.scale() == 131072.0);
  CHECK_FALSE(ls.update(true)); // overflow: skip, halve, count again from zero
  CHECK(ls.scale() == 65536.0);
  CHECK(ls.skipped() == 1);
  CHECK(ls.update(false));
  CHECK(ls.update(false));
  CHECK(ls.scale() == 65536.0);
  CHECK(ls.update(false));
  CHECK(ls.scale() == 131072.0);
}

TEST_CASE("dynamic_loss_scale stays within its bounds") {
  train::loss_scale_options o;
  o.initial = 4;
  o.min_scale = 1;
  o.max_scale = 8;
  o.growth_interval = 1;
  train::dynamic_loss_scale ls(o);
  for (int i = 0; i < 5; ++i)
    (void)ls.update(false);
  CHECK(ls.scale() == 8);
  for (int i = 0; i < 10; ++i)
    CHECK_FALSE(ls.update(true));
  CHECK(ls.scale() == 1);
  CHECK(ls.skipped() == 10);
}

TEST_CASE("dynamic_loss_scale names a bad setting") {
  const auto refused = [](train::loss_scale_options o, const std::string& field) {
    try {
      train::dynamic_loss_scale ls(o);
      FAIL("expected a config_error for " << field);
    } catch (const config_error& e) {
      CHECK(std::string(e.what()).find("field " + field) != std::string::npos);
    }
  };
  train::loss_scale_options o;
  o.backoff = 1.0;
  refused(o, "backoff");
  o = {};
  o.growth = 0.5;
  refused(o, "growth");
  o = {};
  o.initial = 1e9; // above max_scale
  refused(o, "initial");
  o = {};
  o.min_scale = 0;
  refused(o, "min_scale");
  o = {};
  o.growth_interval = 0;
  refused(o, "growth_interval");
}

TEST_CASE("scaling keeps small float16 gradients and backs off from overflow") {
  const float tiny = 1e-8F; // below float16's smallest subnormal (6e-8): flushes to zero
  CHECK(static_cast<float>(float16(tiny)) == 0.0F);
  train::dynamic_loss_scale ls;
  const auto s = static_cast<float>(ls.scale());
  const float recovered = static_cast<float>(float16(tiny * s)) / s;
  CHECK(recovered == Approx(tiny).epsilon(1e-3));

  // A gradient of 1 scaled by 2^16 overflows float16: the step is skipped and the scale halved,
  // after which the same gradient fits.
  const float g = 1.0F;
  const bool overflow = std::isinf(static_cast<float>(float16(g * s)));
  CHECK(overflow);
  CHECK_FALSE(ls.update(overflow));
  const auto s2 = static_cast<float>(ls.scale());
  CHECK(std::isfinite(static_cast<float>(float16(g * s2))));
  CHECK(static_cast<float>(float16(g * s2)) / s2 == 1.0F);
}
