#pragma once
// Calibration of the collective cost model: a short sweep of each uneven algorithm (and of
// all-reduce, broadcast and all-to-all) at a few sizes and split patterns, timed on every rank,
// reduced to the slowest rank, and fitted to t = a * alpha + beta * x (core/collectives.hpp). Every
// rank fits the same max-reduced samples, so every rank gets the same model and `automatic` makes
// the same choice everywhere. The profiler calls this; users may call it at start-up.
//
// Works with any `communicator` whose buffers are host spans.

#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/partition.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace hspmd {

/// What `calibrate_collectives` measures.
struct calibration_options {
  /// Bytes per call, ascending; one cost piece per pair of neighbours (MPI switches algorithms
  /// with the size, so the range should cover the sizes the job moves).
  std::vector<std::size_t> sizes_bytes = {1U << 10U, 1U << 12U, 1U << 14U, 1U << 16U,
                                          1U << 18U, 1U << 20U, 1U << 22U, 1U << 24U};
  int repetitions = 5; ///< timed calls per point (the median counts), after one warm-up call
  /// All-reduce (only) is measured on past the last size, 4x at a time, until it covers this many
  /// bytes: a job's largest gradient bucket. Past the caches a node's all-reduce runs at memory
  /// speed (two ranks of this machine: 16 MiB in 2.9 ms, 64 MiB in 33 ms), which the small
  /// sizes' line does not extrapolate to.
  std::size_t all_reduce_up_to = 0;
};

/// Collective: measures this communicator's collectives and returns the fitted cost model (the
/// same on every rank). Takes about a second on a shared-memory node at default options.
template <class Comm>
requires communicator<Comm, float>
[[nodiscard]] collective_cost_model calibrate_collectives(Comm& comm,
                                                          const calibration_options& opt = {}) {
  using clock = std::chrono::steady_clock;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  collective_cost_model model = comm.cost_model();
  if (n == 1)
    return model; // nothing to measure: every collective is a local copy

  // Even shares, and one rank holding 4x the others (the uneven case the choice is about).
  std::vector<std::vector<double>> patterns = {std::vector<double>(n, 1.0)};
  patterns.emplace_back(n, 1.0);
  patterns.back()[0] = 4.0;

  // Median over repetitions on this rank, then the slowest rank's median.
  const auto time_it = [&](auto&& call) {
    call(); // warm-up
    std::vector<double> t;
    for (int i = 0; i < opt.repetitions; ++i) {
      comm.barrier();
      const auto start = clock::now();
      call();
      t.push_back(std::chrono::duration<double>(clock::now() - start).count());
    }
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    return comm.all_reduce(t[t.size() / 2], reduce_op::max);
  };

  for (collective op : {collective::all_gather_v, collective::reduce_scatter_v}) {
    for (uneven_algorithm alg : concrete_algorithms) {
      std::vector<std::vector<alpha_beta_sample>> samples;
      for (std::size_t bytes : opt.sizes_bytes) {
        samples.emplace_back();
        for (const auto& pattern : patterns) {
          const auto counts = shard_lengths(bytes / sizeof(float), pattern);
          std::size_t total = 0;
          for (std::size_t c : counts)
            total += c;
          std::vector<float> whole(total, 1.0F);
          std::vector<float> part(counts[me], 1.0F);
          const double t = time_it([&] {
            if (op == collective::all_gather_v)
              comm.all_gather_v(std::span<const float>(part), std::span<float>(whole), counts, alg);
            else
              comm.reduce_scatter_v(std::span<const float>(whole), std::span<float>(part), counts,
                                    reduce_op::sum, alg);
          });
          const cost_terms terms = terms_of(op, alg, counts, sizeof(float));
          samples.back().push_back({terms.latency_terms, terms.bytes, t});
        }
      }
      model.set(op, alg, fit_cost_curve(samples));
    }
  }
  for (collective op : {collective::all_reduce, collective::broadcast}) {
    std::vector<std::vector<alpha_beta_sample>> samples;
    std::vector<std::size_t> sizes = opt.sizes_bytes;
    if (op == collective::all_reduce && !sizes.empty())
      while (sizes.back() < opt.all_reduce_up_to && sizes.back() <= (std::size_t{1} << 40U))
        sizes.push_back(4 * sizes.back());
    for (std::size_t bytes : sizes) {
      std::vector<float> buf(bytes / sizeof(float), 1.0F);
      const double t = time_it([&] {
        if (op == collective::all_reduce)
          comm.all_reduce(std::span<float>(buf), reduce_op::sum);
        else
          comm.broadcast(std::span<float>(buf), 0);
      });
      samples.push_back({{1.0, static_cast<double>(bytes), t}});
    }
    model.set(op, uneven_algorithm::native, fit_cost_curve(samples));
  }
  // All-to-all of a piece of `bytes` per rank, an equal part to every rank: the byte term is
  // what leaves a rank, bytes (n - 1) / n.
  std::vector<std::vector<alpha_beta_sample>> samples;
  for (std::size_t bytes : opt.sizes_bytes) {
    const std::vector<std::size_t> counts(n, std::max<std::size_t>(bytes / sizeof(float) / n, 1));
    std::vector<float> in(counts[0] * n, 1.0F);
    std::vector<float> out(in.size());
    const double t = time_it([&] {
      comm.all_to_all_v(std::span<const float>(in), counts, std::span<float>(out), counts);
    });
    const double sent = static_cast<double>(in.size() * sizeof(float)) *
                        static_cast<double>(n - 1) / static_cast<double>(n);
    samples.push_back({{1.0, sent, t}});
  }
  model.set(collective::all_to_all_v, uneven_algorithm::native, fit_cost_curve(samples));
  return model;
}

/// Collective: the fraction of an all-reduce of `bytes` that runs hidden behind compute which
/// drives it (`test`) every `poll_seconds`, as exec::distributed_executor does between nodes:
/// with t_c the blocking all-reduce and t_b the same all-reduce started before t_c of compute,
/// (2 t_c - t_b) / t_c clamped to [0, 1], both the slowest rank's, the median of `repetitions`.
/// On a host whose MPI moves and sums the data on the rank's own core inside `MPI_Test`, only
/// the waiting hides and the fraction is small; a GPU with NCCL's own kernels hides most of it.
/// The same value on every rank (cluster::overlap).
template <class Comm>
requires requires(Comm& c, std::span<float> s, typename Comm::request& r) {
  { c.start_all_reduce(s, reduce_op::sum) } -> std::same_as<typename Comm::request>;
  c.test(r);
  c.wait(r);
}
[[nodiscard]] double measure_overlap(Comm& comm, std::size_t bytes = std::size_t{4} << 20U,
                                     int repetitions = 5, double poll_seconds = 5e-4) {
  using clock = std::chrono::steady_clock;
  std::vector<float> buf(std::max<std::size_t>(bytes / sizeof(float), 1), 1.0F);
  std::vector<float> work(std::size_t{1} << 14U, 1.0F); // compute on a cached tile
  const auto compute_for = [&](double seconds, auto&& between) {
    const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(
                                          std::chrono::duration<double>(seconds));
    auto next_poll = clock::now();
    while (clock::now() < until) {
      for (float& w : work)
        w = w * 0.999F + 0.001F;
      if (clock::now() >= next_poll) {
        between();
        next_poll = clock::now() + std::chrono::duration_cast<clock::duration>(
                                       std::chrono::duration<double>(poll_seconds));
      }
    }
  };
  const auto slowest = [&](clock::time_point start) {
    return comm.all_reduce(std::chrono::duration<double>(clock::now() - start).count(),
                           reduce_op::max);
  };
  comm.all_reduce(std::span<float>(buf), reduce_op::sum); // warm-up
  std::vector<double> fractions;
  for (int r = 0; r < std::max(repetitions, 1); ++r) {
    comm.barrier();
    auto start = clock::now();
    comm.all_reduce(std::span<float>(buf), reduce_op::sum);
    const double alone = slowest(start);
    comm.barrier();
    start = clock::now();
    auto req = comm.start_all_reduce(std::span<float>(buf), reduce_op::sum);
    compute_for(alone, [&] { (void)comm.test(req); });
    comm.wait(req);
    const double both = slowest(start);
    fractions.push_back(alone > 0.0 ? std::clamp((2.0 * alone - both) / alone, 0.0, 1.0) : 0.0);
  }
  std::sort(fractions.begin(), fractions.end());
  return fractions[fractions.size() / 2];
}

} // namespace hspmd
