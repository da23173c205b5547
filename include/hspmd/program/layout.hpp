#pragma once
// Where one rank's piece of a tensor sits in the whole tensor: the global shape, the dimension
// it is split along (if any) and this rank's range there. The lowering (program/lower.hpp) gives
// every node of a rank's local graph one; the executor uses it wherever a kernel must know
// global positions: parameter initialization and dropout masks by global element index, a
// mean's global count, a causal softmax's query offset, a vocabulary-parallel lookup or loss.
//
//     node_layout l{.global = {8, 6}, .split = 0, .offset = 5, .length = 3};
//     l.local_dims();       // {3, 6}
//     l.global_index(7);    // local (1, 1) is global (6, 1): 37

#include <cstddef>
#include <optional>
#include <vector>

namespace hspmd::program {

/// One rank's piece of one tensor.
struct node_layout {
  std::vector<std::size_t> global;  ///< dimensions of the whole tensor
  std::optional<std::size_t> split; ///< the dimension divided among ranks, if any
  std::size_t offset = 0;           ///< start of this rank's range along `split`
  std::size_t length = 0;           ///< length of this rank's range along `split`
  /// Index of the whole tensor's first element in a larger one: a node's rows of the batch in
  /// a two-level plan (exec/hierarchical.hpp), so random masks match the one-process run.
  std::size_t base = 0;
  /// This rank adds the once-only terms of a partial result: the bias of a row-parallel
  /// linear layer, the log-sum-exp of a vocabulary-parallel cross-entropy.
  bool owner = true;
  bool skip_bias = false;      ///< a partial result whose bias another rank adds
  bool vocab_parallel = false; ///< cross-entropy over vocabulary-split logits

  /// The piece's dimensions.
  [[nodiscard]] std::vector<std::size_t> local_dims() const {
    std::vector<std::size_t> d = global;
    if (split)
      d.at(*split) = length;
    return d;
  }
  /// Elements of the whole tensor.
  [[nodiscard]] std::size_t global_size() const {
    std::size_t n = 1;
    for (std::size_t d : global)
      n *= d;
    return n;
  }
  /// Row-major index in the whole tensor of element `local` of the piece.
  [[nodiscard]] std::size_t global_index(std::size_t local) const {
    if (!split || length == 0)
      return local;
    std::size_t inner = 1;
    for (std::size_t d = *split + 1; d < global.size(); ++d)
      inner *= global[d];
    const std::size_t block = length * inner;
    const std::size_t o = local / block;
    const std::size_t rest = local % block;
    return (o * global[*split] + offset + rest / inner) * inner + rest % inner;
  }
  /// The offset of dimension `d` (0 unless `d` is the split one).
  [[nodiscard]] std::size_t offset_of(std::size_t d) const {
    return split && *split == d ? offset : 0;
  }
};

} // namespace hspmd::program
