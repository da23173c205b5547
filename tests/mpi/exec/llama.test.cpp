// Llama-small trains under mpirun like the single process, for every plan and ratio vector
// (tests/support/equivalence.hpp), f32 and f64; with fused attention in f64.
#include <hspmd/models/llama.hpp>

#include "../../support/equivalence.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace hspmd;
using namespace hspmd::test;

TEST_CASE("Llama-small: distributed training equals the single process (f32, f64)") {
  models::llama_config c;
  c.layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 24;
  c.seq = 6;
  c.vocab = 40;
  // No biases; the plans must still split the bias-free projections both ways, rotate split
  // sequences and heads, and take the vocabulary apart.
  const std::vector<std::string> must = {"all_gather", "reduce_scatter", "matmul:split->partial",
                                         "vocab-parallel", "load+sfb"};
  equivalence<float>("llama", models::trace_llama_lm<float>(c, 4), 40, 1e-5, 1e6, must);
  equivalence<double>("llama", models::trace_llama_lm<double>(c, 4), 40, 1e-10, 1e6, must);
}

TEST_CASE("Llama-small with fused attention: distributed training equals the single process") {
  // At 3 ranks only (uneven ratios and a zero-length shard); the 2-rank run adds no path the
  // attention op takes and 10 s of the suite's time.
  if (mpi_communicator().size() != 3)
    return;
  models::llama_config c;
  c.layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 24;
  c.seq = 6;
  c.vocab = 40;
  c.fused_attention = true;
  // The attention op splits by heads or batch (TP, DP) and its key and value gradients come back
  // partial where the queries are split.
  equivalence<double>("llama-fused", models::trace_llama_lm<double>(c, 4), 40, 1e-10, 1e6,
                      {"attention:split", "all_gather", "reduce_scatter", "vocab-parallel"});
}
