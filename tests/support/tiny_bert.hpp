#pragma once
// A tiny BERT-LM configuration for tests that compare runs of the same model (hidden 16, FFN 32,
// 2 heads, sequence 4, vocabulary 24, no dropout, so that runs differ only where a test says).
#include <hspmd/models/bert.hpp>

#include <cstddef>

namespace hspmd::test {

[[nodiscard]] inline models::bert_config tiny_bert(std::size_t layers) {
  models::bert_config c;
  c.layers = layers;
  c.hidden = 16;
  c.ffn = 32;
  c.heads = 2;
  c.seq = 4;
  c.vocab = 24;
  c.dropout = 0.0;
  return c;
}

} // namespace hspmd::test
