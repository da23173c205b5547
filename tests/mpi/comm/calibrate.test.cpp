// Calibration gives every rank the same model, with physical parameters, and the same choices.
#include <hspmd/comm/calibrate.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/core/hash.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace hspmd;

TEST_CASE("calibrated cost models agree across ranks and are physical") {
  mpi_communicator comm;
  calibration_options opt;
  opt.sizes_bytes = {1U << 10U, 1U << 14U, 1U << 18U};
  opt.repetitions = 3;
  const collective_cost_model m = calibrate_collectives(comm, opt);
  std::string bytes;
  for (collective op : {collective::all_gather_v, collective::reduce_scatter_v,
                        collective::all_reduce, collective::broadcast, collective::all_to_all_v})
    for (uneven_algorithm a : concrete_algorithms) {
      double start = 0.0; // the byte term where the piece begins
      for (const cost_piece& piece : m.curve(op, a)) {
        const alpha_beta& p = piece.cost;
        CAPTURE(name(op), name(a), start, piece.up_to_bytes, p.alpha, p.beta);
        CHECK(std::isfinite(p.alpha));
        CHECK(std::isfinite(p.beta));
        // Physical: no negative time anywhere on the piece. A later piece may have a negative
        // intercept (a curve that steepens, core/collective_cost.hpp fit_cost_curve); the first
        // starts at 0 bytes, so its alpha itself is >= 0.
        CHECK(p.alpha + p.beta * start >= 0.0);
        CHECK(p.beta >= 0.0);
        start = piece.up_to_bytes;
        bytes += std::to_string(piece.up_to_bytes) + ":" + std::to_string(p.alpha) + "," +
                 std::to_string(p.beta) + ";";
      }
    }
  // One piece per pair of neighbouring sizes where there is more than one rank.
  CHECK(m.curve(collective::all_gather_v, uneven_algorithm::native).size() ==
        (comm.size() > 1 ? opt.sizes_bytes.size() - 1 : 1));
  const std::uint64_t h = fnv1a64(bytes);
  CHECK(comm.all_reduce(h, reduce_op::min) == h);
  CHECK(comm.all_reduce(h, reduce_op::max) == h);

  comm.set_cost_model(m);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), 1000);
  const auto choice = static_cast<std::int32_t>(comm.choose(collective::all_gather_v, counts, 4));
  CHECK(comm.all_reduce(choice, reduce_op::min) == choice);
  CHECK(comm.all_reduce(choice, reduce_op::max) == choice);
}
