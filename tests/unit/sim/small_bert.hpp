#pragma once
// The small BERT the simulator's tests plan: 2 layers, hidden 64, 2 heads, 16 tokens, vocabulary
// 100.
#include <hspmd/models/zoo.hpp>

#include <cstddef>

namespace hspmd::test {

inline graph::graph small_bert(std::size_t batch) {
  models::model_options o;
  o.layers = 2;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 100;
  return models::trace_model<float>("bert", o, batch);
}

} // namespace hspmd::test
