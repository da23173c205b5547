#pragma once
// Box-intersection resharding: tensors held by the ranks in one layout are moved to another
// with one all-to-all. A *box* is the part of a whole tensor a rank holds: an offset and a
// length per dimension (a split piece is the whole along every dimension but one; a replica is
// the whole). Each rank holds its box of every tensor row-major; for a new layout, every rank
// takes each element of its new box from a rank that holds it in the old one: itself where it
// can, else a holder chosen so replicas share the sending.
//
// Re-balancing while training moves parameters and optimizer state through it (exec/
// distributed_engine.hpp); a checkpoint saved under one layout loads into another the same way.
//
//     std::vector<exec::reshard_item<float>> items;
//     items.push_back({old_boxes, new_boxes, old_piece, new_piece});   // per tensor
//     exec::reshard(comm, std::span<const exec::reshard_item<float>>(items));
//
// The old boxes of a tensor must be, rank by rank, equal (replicas) or disjoint (pieces); the
// new boxes must lie inside the whole covered by the old ones. Anything else throws
// `plan_error` naming the tensor.

#include <hspmd/core/error.hpp>
#include <hspmd/program/lower.hpp>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace hspmd::exec {

/// The part of a whole tensor one rank holds: per dimension, the first index and the count.
struct box {
  std::vector<std::size_t> offset;
  std::vector<std::size_t> length;

  /// The whole tensor of dimensions `dims`.
  [[nodiscard]] static box whole(const std::vector<std::size_t>& dims) {
    return {std::vector<std::size_t>(dims.size(), 0), dims};
  }
  [[nodiscard]] std::size_t size() const {
    return std::accumulate(length.begin(), length.end(), std::size_t{1},
                           [](std::size_t a, std::size_t b) { return a * b; });
  }
  [[nodiscard]] bool empty() const { return size() == 0; }
  [[nodiscard]] std::string to_string() const {
    std::string s = "[";
    for (std::size_t d = 0; d < offset.size(); ++d)
      s += (d > 0 ? ", " : "") + std::to_string(offset[d]) + ":" +
           std::to_string(offset[d] + length[d]);
    return s + "]";
  }
  friend bool operator==(const box&, const box&) = default;
};

/// The elements both boxes hold (an empty box when they do not meet).
[[nodiscard]] inline box intersect(const box& a, const box& b) {
  box out;
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    const std::size_t lo = std::max(a.offset[d], b.offset[d]);
    const std::size_t hi = std::min(a.offset[d] + a.length[d], b.offset[d] + b.length[d]);
    out.offset.push_back(lo);
    out.length.push_back(hi > lo ? hi - lo : 0);
  }
  return out;
}

/// True when every element of `inner` is in `outer`.
[[nodiscard]] inline bool contains(const box& outer, const box& inner) {
  return inner.empty() || intersect(outer, inner) == inner;
}

/// Copies the elements of `part` from `src`, which holds box `in` row-major, to `dst`, which
/// holds box `out` row-major (or adds them to `dst`'s: `add`). `part` lies in both.
template <class T>
void copy_box(const T* src, const box& in, T* dst, const box& out, const box& part,
              bool add = false) {
  const std::size_t rank = part.length.size();
  if (part.empty())
    return;
  if (rank == 0) {
    *dst = add ? *dst + *src : *src;
    return;
  }
  // Strides of both layouts; the last dimension is copied as one run.
  std::vector<std::size_t> si(rank, 1), so(rank, 1);
  for (std::size_t d = rank - 1; d-- > 0;) {
    si[d] = si[d + 1] * in.length[d + 1];
    so[d] = so[d + 1] * out.length[d + 1];
  }
  const std::size_t run = part.length[rank - 1];
  std::vector<std::size_t> at(rank, 0); // index within `part`, the last dimension held at 0
  for (;;) {
    std::size_t a = 0;
    std::size_t b = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      a += (part.offset[d] + at[d] - in.offset[d]) * si[d];
      b += (part.offset[d] + at[d] - out.offset[d]) * so[d];
    }
    if (add)
      for (std::size_t x = 0; x < run; ++x)
        dst[b + x] += src[a + x];
    else
      std::copy_n(src + a, run, dst + b);
    std::size_t d = rank - 1;
    for (;;) {
      if (d == 0)
        return;
      --d;
      if (++at[d] < part.length[d])
        break;
      at[d] = 0;
    }
  }
}

/// Every rank's box of local version `id` of a lowered program (a split version's pieces are
/// contiguous ranges in rank order; any other version is whole on every rank).
[[nodiscard]] inline std::vector<box> boxes_of(const program::local_program& prog,
                                               graph::node_id id) {
  const program::node_layout& l = prog.layouts.at(id);
  std::vector<box> out(prog.ranks, box::whole(l.global));
  if (!l.split)
    return out;
  const auto& lengths = prog.lengths.at(id);
  std::size_t at = 0;
  for (std::size_t r = 0; r < prog.ranks; ++r) {
    const std::size_t len = r < lengths.size() ? lengths[r] : 0;
    out[r].offset[*l.split] = at;
    out[r].length[*l.split] = len;
    at += len;
  }
  return out;
}

/// One tensor to move: every rank's old and new box, and this rank's pieces.
template <class T>
struct reshard_item {
  std::vector<box> from;     ///< per rank: the box it holds now
  std::vector<box> to;       ///< per rank: the box it will hold
  std::span<const T> before; ///< this rank's piece of box from[rank]
  std::span<T> after;        ///< this rank's piece of box to[rank], filled by `reshard`
  std::string name;          ///< named in errors
};

namespace detail {

// The holders of an item's old layout: groups of ranks holding the same box, groups disjoint.
struct holders {
  std::vector<box> boxes;                    // per group
  std::vector<std::vector<std::size_t>> who; // per group, its ranks ascending
  std::vector<std::size_t> group_of;         // per rank
};

template <class T>
[[nodiscard]] holders holders_of(const reshard_item<T>& it) {
  holders h;
  h.group_of.resize(it.from.size());
  for (std::size_t r = 0; r < it.from.size(); ++r) {
    std::optional<std::size_t> g;
    for (std::size_t k = 0; k < h.boxes.size(); ++k)
      if (h.boxes[k] == it.from[r])
        g = k;
      else if (!intersect(h.boxes[k], it.from[r]).empty())
        throw plan_error("resharding " + it.name,
                         "rank " + std::to_string(r) + " holds " + it.from[r].to_string() +
                             ", which overlaps rank " + std::to_string(h.who[k].front()) + "'s " +
                             h.boxes[k].to_string() + " without being equal to it",
                         "give layouts whose pieces are replicas or disjoint");
    if (!g) {
      g = h.boxes.size();
      h.boxes.push_back(it.from[r]);
      h.who.emplace_back();
    }
    if (!it.from[r].empty())
      h.who[*g].push_back(r);
    h.group_of[r] = *g;
  }
  return h;
}

// The part rank `r` sends to rank `q`, if any: q takes what its own old box holds from
// itself, and each other group's part from one of that group's ranks, chosen by q. (Nothing is
// not an empty box: the box of a scalar has no dimensions and one element.)
[[nodiscard]] inline std::optional<box> part_sent(const holders& h, const box& to_q, std::size_t r,
                                                  std::size_t q) {
  const std::size_t g = h.group_of[r];
  const auto& who = h.who[g];
  if (who.empty())
    return std::nullopt;
  const bool q_holds = std::ranges::find(who, q) != who.end();
  const std::size_t sender = q_holds ? q : who[q % who.size()];
  if (sender != r)
    return std::nullopt;
  box part = intersect(h.boxes[g], to_q);
  if (part.empty())
    return std::nullopt;
  return part;
}

[[nodiscard]] inline std::size_t size_of(const std::optional<box>& b) {
  return b ? b->size() : 0;
}

} // namespace detail

/// Moves every item from its old layout to its new one (see the file comment). Collective over
/// `comm` (host memory): one all-to-all for all items.
template <class T, class Comm>
void reshard(Comm& comm, std::span<const reshard_item<T>> items) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<detail::holders> hs;
  for (const reshard_item<T>& it : items) {
    if (it.from.size() != n || it.to.size() != n)
      throw plan_error("resharding " + it.name,
                       "boxes for " + std::to_string(it.from.size()) + " and " +
                           std::to_string(it.to.size()) + " ranks on a communicator of " +
                           std::to_string(n),
                       "give one old and one new box per rank");
    if (it.before.size() != it.from[me].size() || it.after.size() != it.to[me].size())
      throw plan_error("resharding " + it.name,
                       "rank " + std::to_string(me) + "'s pieces have " +
                           std::to_string(it.before.size()) + " and " +
                           std::to_string(it.after.size()) + " elements for boxes " +
                           it.from[me].to_string() + " and " + it.to[me].to_string(),
                       "pass the pieces the boxes describe");
    hs.push_back(detail::holders_of(it));
    std::size_t covered = 0;
    for (std::size_t g = 0; g < hs.back().boxes.size(); ++g)
      if (!hs.back().who[g].empty())
        covered += intersect(hs.back().boxes[g], it.to[me]).size();
    if (covered != it.to[me].size())
      throw plan_error("resharding " + it.name,
                       "rank " + std::to_string(me) + "'s new box " + it.to[me].to_string() +
                           " is not held by any rank in the old layout",
                       "give a new layout within the tensor's old whole");
  }
  std::vector<std::size_t> send(n, 0), recv(n, 0);
  for (std::size_t i = 0; i < items.size(); ++i)
    for (std::size_t q = 0; q < n; ++q) {
      if (q != me) {
        send[q] += detail::size_of(detail::part_sent(hs[i], items[i].to[q], me, q));
        recv[q] += detail::size_of(detail::part_sent(hs[i], items[i].to[me], q, me));
      }
    }
  std::vector<std::size_t> sdisp(n, 0), rdisp(n, 0);
  for (std::size_t q = 1; q < n; ++q) {
    sdisp[q] = sdisp[q - 1] + send[q - 1];
    rdisp[q] = rdisp[q - 1] + recv[q - 1];
  }
  std::vector<T> out(sdisp.back() + send.back());
  std::vector<T> in(rdisp.back() + recv.back());
  for (std::size_t q = 0; q < n; ++q) {
    if (q == me)
      continue;
    std::size_t at = sdisp[q];
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto part = detail::part_sent(hs[i], items[i].to[q], me, q);
      if (!part)
        continue;
      copy_box(items[i].before.data(), items[i].from[me], out.data() + at, *part, *part);
      at += part->size();
    }
  }
  if (n > 1)
    comm.all_to_all_v(std::span<const T>(out), std::span<const std::size_t>(send), std::span<T>(in),
                      std::span<const std::size_t>(recv));
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t at = rdisp[r];
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto part = detail::part_sent(hs[i], items[i].to[me], r, me);
      if (!part)
        continue;
      if (r == me) {
        copy_box(items[i].before.data(), items[i].from[me], items[i].after.data(), items[i].to[me],
                 *part);
      } else {
        copy_box(in.data() + at, *part, items[i].after.data(), items[i].to[me], *part);
        at += part->size();
      }
    }
  }
}

} // namespace hspmd::exec
