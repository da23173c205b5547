#pragma once
// The alpha-beta cost model of the collectives (core/collectives.hpp names them) that picks an
// uneven algorithm per call. It lives in core, not cluster/, because the communication layer
// (which may include only core) uses it to resolve `uneven_algorithm::automatic`; the cluster
// file carries its calibrated curves and the synthesizer prices plans with it.
//
// Each uneven algorithm is modelled as  t = a * alpha + beta * x,  where a and x are the
// algorithm's latency and byte terms for the given counts (see `cost_terms`), and alpha/beta
// come from a calibration run, the cluster file, or defaults derived from the link's latency
// and bandwidth.
//
// Worked example, 2 ranks, counts {8000, 1000} floats (8:1), link 5e9 B/s, 1e-6 s:
//   padded  : a = 1, x = (n-1) * max * 4 B = 32000 B   -> 1e-6 + 32000 / 5e9 = 7.4 us
//   native  : a = 1, x = (total - min) * 4 B = 32000 B -> 7.4 us
//   grouped : a = 2 roots (log2 n = 1 step each), x = 32000 B -> 8.4 us
// For 1:1 the three agree up to alpha; as the split gets more uneven *and* n grows, padding
// costs (n-1) * max while native costs total - min, and calibration sees the difference.

#include <hspmd/core/collectives.hpp>
#include <hspmd/core/error.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd {

/// Latency and inverse bandwidth of one (collective, algorithm): t = a * alpha + beta * x.
struct alpha_beta {
  double alpha = 0.0; ///< seconds per latency term
  double beta = 0.0;  ///< seconds per byte

  friend bool operator==(const alpha_beta&, const alpha_beta&) = default;
};

/// The latency multiplier `a` and byte count `x` of one call (see the file comment).
struct cost_terms {
  double latency_terms = 0.0;
  double bytes = 0.0;
};

/// `a` and `x` of a (collective, algorithm) for per-rank element `counts` (for all_reduce and
/// broadcast, one count: the buffer) of `elem_bytes` bytes each.
/// - padded : a = 1,                 x = (n - 1) * max(counts) * elem_bytes
/// - native : a = 1,                 x = (sum - min(counts)) * elem_bytes
/// - grouped: a = non-empty shards,  x = (sum - min(counts)) * elem_bytes
/// - other collectives: a = 1, x = the buffer's bytes.
[[nodiscard]] inline cost_terms terms_of(collective op, uneven_algorithm alg,
                                         std::span<const std::size_t> counts,
                                         std::size_t elem_bytes) {
  const auto s = static_cast<double>(elem_bytes);
  if (!has_algorithms(op)) {
    std::size_t total = 0;
    for (std::size_t c : counts)
      total += c;
    return {1.0, static_cast<double>(total) * s};
  }
  if (counts.empty())
    return {};
  std::size_t total = 0;
  std::size_t largest = 0;
  std::size_t smallest = counts[0];
  std::size_t non_empty = 0;
  for (std::size_t c : counts) {
    total += c;
    largest = std::max(largest, c);
    smallest = std::min(smallest, c);
    non_empty += c > 0 ? 1U : 0U;
  }
  const auto n = static_cast<double>(counts.size());
  switch (alg) {
  case uneven_algorithm::padded:
    return {1.0, (n - 1.0) * static_cast<double>(largest) * s};
  case uneven_algorithm::grouped:
    return {static_cast<double>(non_empty), static_cast<double>(total - smallest) * s};
  case uneven_algorithm::native:
  case uneven_algorithm::automatic:
    break;
  }
  return {1.0, static_cast<double>(total - smallest) * s};
}

/// Alpha-beta parameters valid for byte terms x <= `up_to_bytes`. MPI and NCCL switch their
/// internal algorithms with the message size, so one straight line per algorithm does not fit
/// from 1 KiB to 64 MiB; a cost curve is a few such pieces, in ascending order, the last one
/// without limit.
struct cost_piece {
  double up_to_bytes = std::numeric_limits<double>::infinity();
  alpha_beta cost;

  friend bool operator==(const cost_piece&, const cost_piece&) = default;
};
using cost_curve = std::vector<cost_piece>;

/// Alpha-beta cost curves for every (collective, algorithm) of one communicator, and the choice
/// `automatic` makes from them. Identical models give identical choices on every rank.
class collective_cost_model {
public:
  /// Defaults for `ranks` ranks joined by a link of `latency` seconds and `bandwidth` bytes/s:
  /// ring-like costs, (n - 1) latency terms per call and ceil(log2 n) per broadcast or reduce
  /// of the grouped algorithm. All-reduce moves 2 (n - 1) / n of the buffer per rank.
  [[nodiscard]] static collective_cost_model from_link(int ranks, double latency,
                                                       double bandwidth) {
    if (ranks < 1 || !(latency >= 0.0) || !(bandwidth > 0.0))
      throw plan_error("collective_cost_model::from_link",
                       "ranks " + std::to_string(ranks) + ", latency " + std::to_string(latency) +
                           ", bandwidth " + std::to_string(bandwidth),
                       "ranks >= 1, latency >= 0 and bandwidth > 0");
    collective_cost_model m;
    const double n = ranks;
    const double steps = n - 1.0;
    const double tree = std::ceil(std::log2(n));
    const double inv_bw = 1.0 / bandwidth;
    for (std::size_t c = 0; c < collective_count; ++c)
      for (std::size_t a = 0; a < uneven_algorithm_count; ++a)
        m.set(static_cast<collective>(c), static_cast<uneven_algorithm>(a),
              {steps * latency, inv_bw});
    for (collective c : {collective::all_gather_v, collective::reduce_scatter_v})
      m.set(c, uneven_algorithm::grouped, {tree * latency, inv_bw});
    m.set(collective::all_reduce, uneven_algorithm::native,
          {2.0 * steps * latency, 2.0 * steps / n * inv_bw});
    m.set(collective::broadcast, uneven_algorithm::native, {tree * latency, inv_bw});
    m.set(collective::barrier, uneven_algorithm::native, {tree * latency, 0.0});
    return m;
  }

  /// The cost curve of (collective, algorithm). Collectives without algorithms use `native`.
  [[nodiscard]] const cost_curve& curve(collective c, uneven_algorithm a) const {
    return curves_.at(static_cast<std::size_t>(c)).at(static_cast<std::size_t>(a));
  }
  /// Replaces the curve; throws `plan_error` unless it is non-empty, ascending, with
  /// non-negative parameters and an unlimited last piece.
  void set(collective c, uneven_algorithm a, cost_curve curve) {
    const bool ascending =
        std::is_sorted(curve.begin(), curve.end(), [](const cost_piece& x, const cost_piece& y) {
          return x.up_to_bytes < y.up_to_bytes;
        });
    // Times must be positive where a piece applies: the first piece from x = 0 (alpha >= 0),
    // later ones from the previous piece's limit (there alpha may be negative: a steeper line
    // that starts higher).
    bool physical = true;
    for (std::size_t i = 0; i < curve.size(); ++i) {
      const alpha_beta& p = curve[i].cost;
      const double from = i == 0 ? 0.0 : curve[i - 1].up_to_bytes;
      physical = physical && std::isfinite(p.alpha) && std::isfinite(p.beta) && p.beta >= 0.0 &&
                 p.alpha + p.beta * from >= 0.0;
    }
    if (curve.empty() || !ascending || !physical || std::isfinite(curve.back().up_to_bytes))
      throw plan_error("collective_cost_model::set",
                       "bad cost curve for " + std::string(name(c)) + "/" + std::string(name(a)),
                       "ascending pieces, beta >= 0, positive times where each piece starts, and "
                       "an unlimited last piece");
    curves_.at(static_cast<std::size_t>(c)).at(static_cast<std::size_t>(a)) = std::move(curve);
  }
  /// One straight line for (collective, algorithm).
  void set(collective c, uneven_algorithm a, alpha_beta p) {
    set(c, a, cost_curve{cost_piece{.cost = p}});
  }
  /// The parameters that apply to a byte term of `bytes`.
  [[nodiscard]] const alpha_beta& params(collective c, uneven_algorithm a, double bytes) const {
    const cost_curve& k = curve(c, a);
    for (const cost_piece& p : k)
      if (bytes <= p.up_to_bytes)
        return p.cost;
    return k.back().cost;
  }

  /// Predicted seconds of one call. `automatic` predicts the algorithm it would choose.
  [[nodiscard]] double estimate(collective op, uneven_algorithm alg,
                                std::span<const std::size_t> counts, std::size_t elem_bytes) const {
    if (!has_algorithms(op))
      alg = uneven_algorithm::native;
    else if (alg == uneven_algorithm::automatic)
      alg = choose(op, counts, elem_bytes);
    const cost_terms t = terms_of(op, alg, counts, elem_bytes);
    const alpha_beta& p = params(op, alg, t.bytes);
    return std::max(0.0, t.latency_terms * p.alpha + t.bytes * p.beta);
  }

  /// The cheapest concrete algorithm for these counts; ties go to native, then padded.
  [[nodiscard]] uneven_algorithm choose(collective op, std::span<const std::size_t> counts,
                                        std::size_t elem_bytes) const {
    if (!has_algorithms(op))
      return uneven_algorithm::native;
    uneven_algorithm best = uneven_algorithm::native;
    double best_time = estimate(op, best, counts, elem_bytes);
    for (uneven_algorithm a : concrete_algorithms) {
      const double t = estimate(op, a, counts, elem_bytes);
      if (t < best_time) {
        best = a;
        best_time = t;
      }
    }
    return best;
  }

  friend bool operator==(const collective_cost_model&, const collective_cost_model&) = default;

private:
  std::array<std::array<cost_curve, uneven_algorithm_count>, collective_count> curves_{};
};

/// One measured call: its cost terms and its time.
struct alpha_beta_sample {
  double latency_terms = 0.0;
  double bytes = 0.0;
  double seconds = 0.0;
};

/// Fits t = a * alpha + x * beta to measured samples by least squares on the *relative* error
/// (weights 1 / t^2, so microsecond and millisecond samples count alike), with beta >= 0 and,
/// unless `negative_alpha` allows it (a piece that starts above x = 0), alpha >= 0.
/// Pure and deterministic: the same samples give the same bits on every rank.
[[nodiscard]] inline alpha_beta fit_alpha_beta(std::span<const alpha_beta_sample> samples,
                                               bool negative_alpha = false) {
  double saa = 0, sax = 0, sxx = 0, sat = 0, sxt = 0;
  for (const auto& s : samples) {
    if (!(s.seconds > 0.0))
      continue;
    const double w = 1.0 / (s.seconds * s.seconds);
    saa += w * s.latency_terms * s.latency_terms;
    sax += w * s.latency_terms * s.bytes;
    sxx += w * s.bytes * s.bytes;
    sat += w * s.latency_terms * s.seconds;
    sxt += w * s.bytes * s.seconds;
  }
  const double det = saa * sxx - sax * sax;
  if (det > 1e-12 * saa * sxx) {
    const alpha_beta both{(sat * sxx - sxt * sax) / det, (saa * sxt - sax * sat) / det};
    if ((negative_alpha || both.alpha >= 0.0) && both.beta >= 0.0)
      return both;
  }
  // The unconstrained optimum has a negative parameter (not physical) or the samples cannot
  // tell the two apart: fit each alone and keep the better.
  const alpha_beta only_alpha{saa > 0.0 ? sat / saa : 0.0, 0.0};
  const alpha_beta only_beta{0.0, sxx > 0.0 ? sxt / sxx : 0.0};
  const auto residual = [&](const alpha_beta& q) {
    double r = 0.0;
    for (const auto& smp : samples)
      if (smp.seconds > 0.0) {
        const double e =
            (smp.latency_terms * q.alpha + smp.bytes * q.beta - smp.seconds) / smp.seconds;
        r += e * e;
      }
    return r;
  };
  return residual(only_alpha) <= residual(only_beta) ? only_alpha : only_beta;
}

/// Fits a cost curve to samples measured at ascending sizes (`by_size[i]`: the samples of the
/// i-th size). Piece i is fitted on sizes i and i + 1 and reaches up to the largest byte term
/// measured at size i + 1; the last piece has no limit. One size gives one straight line.
/// Worked example: a time that turns 4x steeper at 1 MB, measured at 1e4 .. 1e8 bytes, gives
/// four pieces, each exact at its two sizes; the one from 1e6 to 1e7 has a negative alpha.
[[nodiscard]] inline cost_curve
fit_cost_curve(const std::vector<std::vector<alpha_beta_sample>>& by_size) {
  if (by_size.size() <= 1)
    return {{std::numeric_limits<double>::infinity(),
             fit_alpha_beta(by_size.empty() ? std::span<const alpha_beta_sample>{}
                                            : std::span<const alpha_beta_sample>(by_size[0]))}};
  cost_curve curve;
  for (std::size_t i = 0; i + 1 < by_size.size(); ++i) {
    std::vector<alpha_beta_sample> pair(by_size[i]);
    pair.insert(pair.end(), by_size[i + 1].begin(), by_size[i + 1].end());
    double reach = std::numeric_limits<double>::infinity();
    if (i + 2 < by_size.size()) {
      reach = 0.0;
      for (const auto& smp : by_size[i + 1])
        reach = std::max(reach, smp.bytes);
    }
    alpha_beta p = fit_alpha_beta(pair, i > 0);
    if (i > 0 && p.alpha + p.beta * curve.back().up_to_bytes < 0.0)
      p = fit_alpha_beta(pair); // would predict negative times where the piece starts
    curve.push_back({reach, p});
  }
  return curve;
}

} // namespace hspmd
