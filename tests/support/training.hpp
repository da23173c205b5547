#pragma once
// Options of the library trainer for tests: a constant learning rate, no output.
#include <hspmd/train/trainer.hpp>

#include <cstddef>

namespace test_support {

inline hspmd::train::train_options quiet_training(std::size_t steps, double lr, double clip) {
  hspmd::train::train_options o;
  o.steps = steps;
  o.lr = hspmd::train::lr_schedule::constant(lr);
  o.clip = clip;
  o.out = nullptr;
  return o;
}

} // namespace test_support
