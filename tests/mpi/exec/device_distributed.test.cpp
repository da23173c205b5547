// The distributed executor with its tensors on a device-like backend: the guarded backend's
// pages are PROT_NONE outside its own calls, so every transfer, bucket, SFB and reduction must
// move the rank's buffers through the backend (here staged through host copies for MPI, as a
// device without a CUDA-aware MPI needs). Every plan and ratio vector trains equal to the
// single process, as on the host (tests/support/equivalence.hpp). Plain BERT is covered by the
// BERT-MoE model (its every second layer is a plain FFN).
//
// The deferred backend is asynchronous like a device's stream (tests/support/deferred_backend.hpp,
// stream_communicator.hpp): with it every plan must still wait for the kernels that write what it
// moves, staged over MPI and with a device communicator whose gradient buckets start ordered after
// the stream's queue (no host wait in the backward pass), as NCCL's do after the CUDA backend's
// stream.
#include <hspmd/exec/distributed.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/zoo.hpp>

#include "../../support/equivalence.hpp"
#include "../../support/guarded_backend.hpp"
#include "../../support/stream_communicator.hpp"

#include <catch2/catch.hpp>

using namespace hspmd;

namespace {
models::bert_config small_bert_moe() {
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
  return c;
}
} // namespace

TEST_CASE("MLP on a device-like backend: distributed training equals the single process") {
  models::model_options o;
  o.layers = 2;
  o.hidden = 24;
  test::equivalence<float, test::guarded_backend>("mlp", models::trace_model<float>("mlp", o, 12),
                                                  10, 1e-5, 1e6);
}

TEST_CASE("BERT-MoE on a device-like backend: distributed training equals the single process") {
  // Every transfer kind, SFB, vocabulary parallelism and the buckets, at 2 ranks and for 2 steps
  // only: each backend call opens and closes every guarded buffer (10 steps took 50 s here), and
  // a step moves every buffer its plan moves; the second one runs on updated parameters and
  // momentum. The MLP covers 3 ranks and a zero-length shard, and the deferred backend below
  // trains BERT-MoE for the full 10 steps.
  if (mpi_communicator().size() != 2)
    return;
  test::equivalence<float, test::guarded_backend>("bert-moe",
                                                  models::trace_bert_lm<float>(small_bert_moe(), 4),
                                                  40, 1e-5, 1e6, test::default_must, 2);
}

TEST_CASE("an asynchronous backend: distributed training equals the single process, staged and "
          "stream-ordered") {
  models::model_options o;
  o.layers = 2;
  o.hidden = 24;
  const auto mlp = models::trace_model<float>("mlp", o, 12);
  const auto bert = models::trace_bert_lm<float>(small_bert_moe(), 4);
  SECTION("staged through the host over MPI") {
    test::equivalence<float, test::deferred_backend>("mlp", mlp, 10, 1e-5, 1e6);
    test::equivalence<float, test::deferred_backend>("bert-moe", bert, 40, 1e-5, 1e6);
  }
  SECTION("a device communicator, buckets ordered after the stream") {
    // SFB's factors move directly and its product runs as a functor on the backend.
    test::equivalence<float, test::deferred_backend, test::stream_communicator>("mlp", mlp, 10,
                                                                                1e-5, 1e6);
    test::equivalence<float, test::deferred_backend, test::stream_communicator>("bert-moe", bert,
                                                                                40, 1e-5, 1e6);
  }
}

TEST_CASE("stream-ordered gradient buckets start without a host wait in the backward pass") {
  test::stream_communicator comm;
  const auto n = static_cast<std::size_t>(comm.size());
  models::model_options o;
  o.layers = 3;
  o.hidden = 24;
  const auto g = models::trace_model<float>("mlp", o, 12);
  const cluster c = test::make_cluster(n, 1e6);
  const synth::plan p = synth::make_baseline(g, c, synth::baseline::dp_ev, {}, "mlp");
  exec::distributed_executor<float, test::stream_communicator, test::deferred_backend> dx(g, p,
                                                                                          comm, 7);
  dx.set_bucket_bytes(256);
  const std::size_t buckets = dx.gradient_buckets().size();
  REQUIRE(buckets > 1); // several all-reduces start during the backward
  exec::sgd opt(0.05, 0.9);
  for (std::size_t s = 0; s < 3; ++s) {
    const auto b = test::data_for<float>(g, s, 10);
    for (const auto& [name, v] : b.values)
      dx.set_input(name, std::span<const float>(v));
    for (const auto& [name, v] : b.ids)
      dx.set_input(name, std::span<const std::int64_t>(v));
    dx.set_step(s);
    (void)dx.forward();
    const test::deferred_queue& q = dx.local().backend().queue();
    const std::size_t syncs = q.synchronizations;
    const std::size_t waits = q.stream_waits;
    dx.backward();
    INFO("step " << s);
    CHECK(q.synchronizations == syncs); // no host wait for the stream in the backward pass
    CHECK(q.stream_waits - waits == buckets);
    dx.clip_grad_norm(0.5);
    opt.step(dx.local());
  }
}
