// The distributed executor with its tensors on a device-like backend: the guarded backend's
// pages are PROT_NONE outside its own calls, so every transfer, bucket, SFB and reduction must
// move the rank's buffers through the backend (here staged through host copies for MPI, as a
// device without a CUDA-aware MPI needs). Every plan and ratio vector trains equal to the
// single process, as on the host (tests/support/equivalence.hpp). Plain BERT is covered by the
// BERT-MoE model (its every second layer is a plain FFN).
#include <hspmd/exec/distributed.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/zoo.hpp>

#include "../../support/equivalence.hpp"
#include "../../support/guarded_backend.hpp"

#include <catch2/catch.hpp>

using namespace hspmd;

TEST_CASE("MLP on a device-like backend: distributed training equals the single process") {
  models::model_options o;
  o.layers = 2;
  o.hidden = 24;
  test::equivalence<float, test::guarded_backend>("mlp", models::trace_model<float>("mlp", o, 12),
                                                  10, 1e-5, 1e6);
}

TEST_CASE("BERT-MoE on a device-like backend: distributed training equals the single process") {
  // Every transfer kind, SFB, vocabulary parallelism and the buckets, at 2 ranks only: each
  // backend call opens and closes every guarded buffer (a minute here; the MLP covers 3 ranks
  // and a zero-length shard).
  if (mpi_communicator().size() != 2)
    return;
  models::bert_config c;
  c.layers = 2;
  c.hidden = 16;
  c.ffn = 32;
  c.heads = 2;
  c.seq = 6;
  c.vocab = 40;
  c.moe_experts = 4;
  // Routing is per rank under token parallelism: equal to the single process when no token is
  // dropped, so the capacity holds every token (as in mpi/exec/distributed.test.cpp).
  c.capacity_factor = 8.0;
  test::equivalence<float, test::guarded_backend>("bert-moe", models::trace_bert_lm<float>(c, 4),
                                                  40, 1e-5, 1e6);
}
