#pragma once
// What every kernel pair sees, and the index helpers kernels share.
//
// A kernel pair is `kernel<op::X>` (in kernels/<family>.hpp) with
//     template <class T, class B> static void forward(kernel_context<T, B>& c);
//     template <class T, class B> static void backward(kernel_context<T, B>& c);
// `forward` writes the node's value from its inputs; `backward` *adds* the input gradients from
// the output gradient (a node used twice receives two contributions). A pair may declare
// `static constexpr std::uint32_t assigns`, a bit per input whose gradient its backward writes
// whole: where the executor says the node is that gradient's first writer in the reverse sweep
// (`kernel_context::assign(k)`), it stores instead of adding, and the executor does not zero the
// buffer first (`contribute`). The arithmetic is in
// HSPMD_HD functors launched through `for_each_index` and `gemm` of the backend, so the same
// functor runs on the host here and on a device under nvcc. Host-side work in a kernel is limited
// to checking inputs and choosing launches.

#include <hspmd/core/error.hpp>
#include <hspmd/core/extents.hpp>
#include <hspmd/core/fastmath.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/signature.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/program/layout.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace hspmd::exec {

/// The kernels of op O: a specialization per op in kernels/<family>.hpp.
template <graph::op O>
struct kernel;

/// Every node's storage, owned by the executor and handed to kernels through `kernel_context`.
template <class T, backend B>
struct node_storage {
  template <class E>
  using buffer = typename B::template buffer<E>;
  std::vector<buffer<T>> values;         ///< buffers of the nodes that own their value
  std::vector<std::span<T>> value_views; ///< each node's value: its own buffer or its input's
  std::vector<std::span<T>> grads;       ///< a buffer of the node's own or a range of a shared one
  std::vector<buffer<std::int64_t>> ids;
  std::vector<buffer<T>> saved;                 ///< state a forward keeps for its backward
  std::vector<buffer<std::size_t>> saved_index; ///< (max pooling: where each maximum came from)
  std::vector<program::node_layout> layouts;    ///< empty when the graph is not a rank's piece
  /// Per node, a bit per input: the node's backward is the first to write that input's gradient
  /// and stores it (empty: every backward adds).
  std::vector<std::uint32_t> assign;
  /// Per node: its value and gradient lie with dimensions 1 and 2 exchanged, in its input's
  /// order (a permute {0, 2, 1, 3} that only batched matmuls read, by strides; empty: none).
  std::vector<bool> swapped;
};

/// One node's view of the executor, for its kernels.
template <class T, backend B>
class kernel_context {
public:
  /// Sums (or takes the maximum of) `data` element-wise over the ranks of a vocabulary-parallel
  /// cross-entropy.
  using row_reduce_fn = std::function<void(std::span<T> data, bool max)>;
  /// Training state that kernels read.
  struct run_state {
    std::uint64_t seed = 0;
    std::uint64_t step = 0;
    bool training = true;
    const row_reduce_fn* row_reduce = nullptr;
    /// What GEMM operands are rounded to (kernels/precision.hpp); the executor rounds what kernels
    /// store.
    exec::precision precision = exec::precision::f32;
    /// A bit per input: the backward's gradients wanted (a split backward, exec/executor.hpp
    /// `backward_part`, asks for the input or the weight gradients only). A kernel may skip an
    /// unwanted one; the executor sends what it writes there to scratch memory.
    std::uint32_t wanted = ~0U;
  };

  kernel_context(B& backend, const graph::graph& g, graph::node_id id, node_storage<T, B>& s,
                 const run_state& state)
      : backend_(&backend), g_(&g), id_(id), s_(&s), state_(state) {}

  [[nodiscard]] B& backend() const noexcept { return *backend_; }
  [[nodiscard]] const graph::node& node() const { return (*g_)[id_]; }
  [[nodiscard]] graph::node_id id() const noexcept { return id_; }
  [[nodiscard]] const graph::attributes& attrs() const { return node().attrs; }
  [[nodiscard]] const hspmd::shape& out_shape() const { return node().out; }
  [[nodiscard]] const hspmd::shape& in_shape(std::size_t k) const { return input_node(k).out; }
  [[nodiscard]] std::size_t arity() const { return node().inputs.size(); }
  [[nodiscard]] std::size_t out_size() const { return node().out.size(); }

  /// The node's value, input k's value, the gradients of both.
  [[nodiscard]] T* out() const { return s_->value_views[id_].data(); }
  [[nodiscard]] T* dout() const { return s_->grads[id_].data(); }
  [[nodiscard]] const T* in(std::size_t k) const { return s_->value_views[input(k)].data(); }
  [[nodiscard]] T* din(std::size_t k) const { return s_->grads[input(k)].data(); }
  /// Whether this node's (or input k's) value and gradient lie with dimensions 1 and 2
  /// exchanged (`node_storage::swapped`).
  [[nodiscard]] bool swapped() const { return !s_->swapped.empty() && s_->swapped[id_]; }
  [[nodiscard]] bool in_swapped(std::size_t k) const {
    return !s_->swapped.empty() && s_->swapped[input(k)];
  }
  /// Whether the backward stores input k's gradient instead of adding to it: this node is its
  /// first writer and the buffer was not zeroed (only for inputs in the kernel's `assigns`).
  [[nodiscard]] bool assign(std::size_t k) const {
    return !s_->assign.empty() && ((s_->assign[id_] >> k) & 1U) != 0;
  }
  /// Whether the backward's caller wants input k's gradient (see `run_state::wanted`).
  [[nodiscard]] bool wants(std::size_t k) const {
    return k >= 32 || ((state_.wanted >> k) & 1U) != 0;
  }
  /// Input k's integer values (token ids, labels), on the host.
  [[nodiscard]] std::span<const std::int64_t> ids(std::size_t k) const {
    auto& b = s_->ids[input(k)];
    return {b.data(), b.size()};
  }

  /// Where the node's (or input k's) piece sits in the whole tensor; nullptr for whole tensors.
  [[nodiscard]] const program::node_layout* layout() const { return layout_of(id_); }
  [[nodiscard]] const program::node_layout* in_layout(std::size_t k) const {
    return layout_of(input(k));
  }
  /// Elements of the whole tensor input k holds a piece of (at least 1).
  [[nodiscard]] std::size_t in_global_size(std::size_t k) const {
    const program::node_layout* l = in_layout(k);
    const std::size_t n = l != nullptr ? l->global_size() : in_shape(k).size();
    return n == 0 ? 1 : n;
  }
  /// A bias this node would add is another rank's to add (a row-parallel partial result).
  [[nodiscard]] bool skip_bias() const {
    const program::node_layout* l = layout();
    return l != nullptr && l->skip_bias;
  }

  /// State kept from this node's forward to its backward: n elements (kept when the size fits).
  [[nodiscard]] T* saved(std::size_t n) const { return fit(s_->saved[id_], n); }
  [[nodiscard]] std::size_t* saved_index(std::size_t n) const {
    return fit(s_->saved_index[id_], n);
  }
  /// The state the forward saved.
  [[nodiscard]] const T* saved() const { return s_->saved[id_].data(); }
  [[nodiscard]] const std::size_t* saved_index() const { return s_->saved_index[id_].data(); }

  [[nodiscard]] const run_state& state() const noexcept { return state_; }
  void row_reduce(std::span<T> data, bool max) const {
    if (state_.row_reduce == nullptr || !*state_.row_reduce)
      throw plan_error("executor", "a vocabulary-parallel cross-entropy without a communicator",
                       "run local graphs through exec::distributed_executor");
    (*state_.row_reduce)(data, max);
  }

  /// A shape_error naming this node.
  [[noreturn]] void fail(const std::string& why, const std::string& fix) const {
    throw shape_error("graph node \"" + node().name + "\"", why, fix);
  }

private:
  [[nodiscard]] graph::node_id input(std::size_t k) const { return node().inputs.at(k); }
  [[nodiscard]] const graph::node& input_node(std::size_t k) const { return (*g_)[input(k)]; }
  [[nodiscard]] const program::node_layout* layout_of(graph::node_id id) const {
    return s_->layouts.empty() ? nullptr : &s_->layouts.at(id);
  }
  template <class E>
  [[nodiscard]] E* fit(typename node_storage<T, B>::template buffer<E>& b, std::size_t n) const {
    if (b.size() != n)
      b = backend_->template allocate<E>(n);
    return b.data();
  }

  B* backend_;
  const graph::graph* g_;
  graph::node_id id_;
  node_storage<T, B>* s_;
  run_state state_;
};

/// A node's GEMM: on its backend, operands in the run's precision (kernels/precision.hpp).
template <class T, class B>
void gemm(const kernel_context<T, B>& c, transpose ta, transpose tb, std::size_t m, std::size_t n,
          std::size_t k, T alpha, const T* a, std::size_t lda, const T* bm, std::size_t ldb, T beta,
          T* out, std::size_t ldc) {
  gemm_in(c.backend(), c.state().precision, ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, out,
          ldc);
}
/// A node's batched GEMM, operands in the run's precision.
template <class T, class B>
void gemm_strided_batched(const kernel_context<T, B>& c, transpose ta, transpose tb, std::size_t m,
                          std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                          std::size_t stride_a, const T* bm, std::size_t ldb, std::size_t stride_b,
                          T beta, T* out, std::size_t ldc, std::size_t stride_c,
                          std::size_t batch) {
  gemm_strided_batched_in(c.backend(), c.state().precision, ta, tb, m, n, k, alpha, a, lda,
                          stride_a, bm, ldb, stride_b, beta, out, ldc, stride_c, batch);
}

/// The kernel pair of an op whose backward runs its forward's data movement in reverse:
/// `Self::run(c, backward)` does both.
template <class Self>
struct two_way_kernel {
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    Self::run(c, false);
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    Self::run(c, true);
  }
};

/// A backward's contribution v to a gradient element d: stored where the node is the gradient's
/// first writer (`kernel_context::assign`), else added. Branch-free, so element loops vectorize;
/// what a stored element held before (another gradient's leftovers) is not read into v.
template <class T>
HSPMD_HD HSPMD_INLINE void contribute(T& d, T v, bool assign) {
  d = math::select(assign, v, d + v);
}

/// Columns per functor index of the kernels that reduce over rows (bias and normalization
/// gradients, embedding scatters) on a backend whose buffers are host memory: each index owns a
/// block of columns and walks the rows, so it reads contiguous pieces of every row and the loop
/// over the block vectorizes.
inline constexpr std::size_t column_block = 64;
/// The columns per index on backend B: `column_block` on the host; one on a device, where
/// adjacent threads then read adjacent columns (coalesced) and there are as many threads as
/// columns, not 1/64 of them (BERT-base's bias gradients ran on 12 threads of an H200). The
/// width changes which index computes a column, never the order of a column's sum.
template <class B>
inline constexpr std::size_t column_width_v = host_memory_v<B> ? column_block : 1;
/// The number of blocks of `width` columns in `n` columns.
[[nodiscard]] constexpr std::size_t column_blocks(std::size_t n, std::size_t width = column_block) {
  return (n + width - 1) / width;
}

/// Runs f(r, j0, w) -- columns [j0, j0 + w) of row r -- over every W-column slice of `rows`
/// rows of `len` columns: the element-wise writers of rows (a bias written into a linear's
/// output, a trailing block added to every row, an embedding's rows), one index per slice.
template <std::size_t W, class F>
struct row_slices {
  F f;
  std::size_t len, blocks;
  HSPMD_HD void operator()(std::size_t index) const {
    const std::size_t r = index / blocks;
    const std::size_t j0 = (index % blocks) * W;
    f(r, j0, len - j0 < W ? len - j0 : W);
  }
};
/// f(r, j0, w) over the `column_width_v<B>`-column slices of a rows x len matrix: 64 columns an
/// index on the host (a vectorized loop), one on a device (a thread per element, coalesced; one
/// thread per row wrote BERT-base's head bias on an H200 in 8 ms of a 12.5 ms layer).
template <class B, class F>
void for_each_row_slice(B& backend, std::size_t rows, std::size_t len, const F& f) {
  if (len == 0)
    return;
  constexpr std::size_t width = column_width_v<B>;
  const std::size_t blocks = column_blocks(len, width);
  for_each_index(backend, rows * blocks, row_slices<width, F>{f, len, blocks});
}

/// Rows per chunk of a column reduction (`column_sums`): every backend sums a column's rows in
/// chunks of this many, in order, and then the chunks' sums, in order from zero -- so a device
/// sums the chunks in parallel and every backend gets the same bits.
inline constexpr std::size_t column_chunk = 64;

/// K sums of one column (what a column reduction's term gives for one element).
template <class T, std::size_t K>
struct column_terms {
  T v[K];
};

/// Pass 1 of `column_sums`: index c * blocks + b sums rows [c * column_chunk, ...) of the W
/// columns of block b into partial[(k * chunks + c) * n + j].
template <class T, std::size_t W, std::size_t K, class Term>
struct column_chunk_sums {
  Term term;
  T* partial;
  std::size_t rows, n, blocks, chunks;
  HSPMD_HD void operator()(std::size_t index) const {
    const std::size_t c = index / blocks;
    const std::size_t j0 = (index % blocks) * W;
    const std::size_t w = n - j0 < W ? n - j0 : W;
    const std::size_t i0 = c * column_chunk;
    const std::size_t i1 = rows - i0 < column_chunk ? rows : i0 + column_chunk;
    T s[K][W] = {};
    for (std::size_t i = i0; i < i1; ++i)
      for (std::size_t j = 0; j < w; ++j) {
        const column_terms<T, K> t = term(i, j0 + j);
        for (std::size_t k = 0; k < K; ++k)
          s[k][j] += t.v[k];
      }
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t j = 0; j < w; ++j)
        partial[(k * chunks + c) * n + j0 + j] = s[k][j];
  }
};

/// Pass 2 of `column_sums`: column j's chunk sums added in order, handed to finish(j, sums).
template <class T, std::size_t K, class Finish>
struct column_chunk_totals {
  const T* partial;
  std::size_t n, chunks;
  Finish finish;
  HSPMD_HD void operator()(std::size_t j) const {
    column_terms<T, K> s{};
    for (std::size_t c = 0; c < chunks; ++c)
      for (std::size_t k = 0; k < K; ++k)
        s.v[k] += partial[(k * chunks + c) * n + j];
    finish(j, s);
  }
};

/// Column sums of a rows x n matrix given by term(i, j) (a `column_terms<T, K>`: K sums at
/// once), each handed to finish(j, sums): the rows in chunks of `column_chunk` on every backend
/// (see there), the chunks in parallel, `column_width_v<B>` columns per index. Term and Finish
/// are HSPMD_HD functors.
template <class T, std::size_t K, class B, class Term, class Finish>
void column_sums(B& backend, std::size_t rows, std::size_t n, const Term& term,
                 const Finish& finish) {
  if (n == 0)
    return;
  constexpr std::size_t width = column_width_v<B>;
  const std::size_t blocks = column_blocks(n, width);
  const std::size_t chunks = (rows + column_chunk - 1) / column_chunk;
  auto partial = backend.template allocate<T>(K * chunks * n);
  for_each_index(
      backend, chunks * blocks,
      column_chunk_sums<T, width, K, Term>{term, partial.data(), rows, n, blocks, chunks});
  for_each_index(backend, n, column_chunk_totals<T, K, Finish>{partial.data(), n, chunks, finish});
}

/// The column-sum term of a row-major matrix: m[i, j].
template <class T>
struct matrix_column {
  const T* m;
  std::size_t n;
  HSPMD_HD column_terms<T, 1> operator()(std::size_t i, std::size_t j) const {
    return {{m[i * n + j]}};
  }
};
/// The column-sum finish that contributes sign * the sum to d[j] (a bias's gradient).
template <class T>
struct contribute_column {
  T* d;
  T sign;
  bool assign = false;
  HSPMD_HD void operator()(std::size_t j, const column_terms<T, 1>& s) const {
    contribute(d[j], sign * s.v[0], assign);
  }
};

/// Independent accumulators of the row reductions (sums, maxima): a row is reduced in this many
/// lanes, combined pairwise in a fixed order at the end, so the compiler vectorizes the loop
/// without reassociating on its own and every backend and rank reduces in the same order.
inline constexpr std::size_t reduce_lanes = 16;

/// The sum of term(j) for j in [0, n), in `reduce_lanes` lanes.
template <class T, class F>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T lane_sum(std::size_t n, const F& term) {
  T acc[reduce_lanes] = {};
  std::size_t j = 0;
  for (; j + reduce_lanes <= n; j += reduce_lanes)
    for (std::size_t l = 0; l < reduce_lanes; ++l)
      acc[l] += term(j + l);
  for (std::size_t l = 0; j + l < n; ++l)
    acc[l] += term(j + l);
  for (std::size_t w = reduce_lanes / 2; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l)
      acc[l] += acc[l + w];
  return acc[0];
}
/// The maximum of x[0 .. n) (n >= 1), in `reduce_lanes` lanes. Float lanes compare as ordered
/// integers (`math::detail::key`): the float comparison in a select kept GCC from vectorizing
/// the loop inside row kernels (a cross-entropy's row maxima ran scalar, 5x slower). The same
/// maximum for every input without NaN (a NaN is the largest key, so it propagates).
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T lane_max(const T* x, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    using math::detail::key;
    std::int32_t acc[reduce_lanes];
    for (std::size_t l = 0; l < reduce_lanes; ++l)
      acc[l] = key(x[0]);
    std::size_t j = 0;
    for (; j + reduce_lanes <= n; j += reduce_lanes)
      for (std::size_t l = 0; l < reduce_lanes; ++l) {
        const std::int32_t k = key(x[j + l]);
        acc[l] = k > acc[l] ? k : acc[l];
      }
    for (std::size_t l = 0; j + l < n; ++l) {
      const std::int32_t k = key(x[j + l]);
      acc[l] = k > acc[l] ? k : acc[l];
    }
    for (std::size_t w = reduce_lanes / 2; w > 0; w /= 2)
      for (std::size_t l = 0; l < w; ++l)
        acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
    return math::detail::from_key(acc[0]);
  } else {
    T acc[reduce_lanes];
    for (std::size_t l = 0; l < reduce_lanes; ++l)
      acc[l] = x[0];
    std::size_t j = 0;
    for (; j + reduce_lanes <= n; j += reduce_lanes)
      for (std::size_t l = 0; l < reduce_lanes; ++l)
        acc[l] = math::select(x[j + l] > acc[l], x[j + l], acc[l]);
    for (std::size_t l = 0; j + l < n; ++l)
      acc[l] = math::select(x[j + l] > acc[l], x[j + l], acc[l]);
    for (std::size_t w = reduce_lanes / 2; w > 0; w /= 2)
      for (std::size_t l = 0; l < w; ++l)
        acc[l] = math::select(acc[l + w] > acc[l], acc[l + w], acc[l]);
    return acc[0];
  }
}

/// The host's row team: one thread does a whole row, reducing in `reduce_lanes` lanes. Row
/// functors (`f(r, team)`, run by `for_each_row`) loop and reduce over their row only through a
/// team, so that a device can give a row several threads (exec/backends/device_launch.cuh
/// `lane_team`: 16 threads, one per lane, combined in this order). Loop bodies capture by value:
/// a scalar captured by reference could alias the row the loop writes, and the loop would not
/// vectorize.
struct serial_team {
  template <class F>
  HSPMD_HD HSPMD_INLINE void for_each(std::size_t n, const F& f) const {
    for (std::size_t j = 0; j < n; ++j)
      f(j);
  }
  template <class T, class F>
  [[nodiscard]] HSPMD_HD HSPMD_INLINE T sum(std::size_t n, const F& term) const {
    return lane_sum<T>(n, term);
  }
  template <class T>
  [[nodiscard]] HSPMD_HD HSPMD_INLINE T max(const T* x, std::size_t n) const {
    return lane_max(x, n);
  }
  /// Whether this thread writes the row's single results (every team has exactly one).
  [[nodiscard]] HSPMD_HD HSPMD_INLINE bool leader() const { return true; }
  /// Whether `for_each` gives element j to this thread.
  [[nodiscard]] HSPMD_HD HSPMD_INLINE bool owns(std::size_t /*j*/) const { return true; }
};

/// A row functor as an index functor with the serial team.
template <class F>
struct serial_rows {
  F f;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t r) const { f(r, serial_team{}); }
};

/// Runs the row functor f(r, team) for every row r in [0, rows): on a backend's own
/// `for_each_row` where it has one (a device's thread teams), else one index per row with the
/// serial team.
template <backend B, class F>
void for_each_row(B& b, std::size_t rows, const F& f) {
  if constexpr (requires { b.for_each_row(rows, f); })
    b.for_each_row(rows, f);
  else
    b.for_each_index(rows, serial_rows<F>{f});
}

/// Maps an element of a broadcast result to the element of one operand it reads (numpy rules,
/// trailing alignment). Trivially copyable, for device functors.
struct broadcast_index {
  std::size_t rank = 0;
  std::size_t dims[graph::max_rank]{};   // the result's dimensions
  std::size_t stride[graph::max_rank]{}; // the operand's stride per result dimension (0: repeated)
  bool identity = true;                  // the operand has the result's shape
  std::size_t modulo = 0;                // nonzero: the operand is the result's trailing block

  broadcast_index() = default;
  broadcast_index(const hspmd::shape& operand, const hspmd::shape& result) {
    rank = result.rank();
    const std::size_t off = rank - operand.rank();
    std::size_t s = 1;
    for (std::size_t i = operand.rank(); i-- > 0;) {
      stride[off + i] = operand.dims[i] == 1 ? 0 : s;
      s *= operand.dims[i];
    }
    for (std::size_t i = 0; i < rank; ++i)
      dims[i] = result.dims[i];
    identity = operand.dims == result.dims;
    bool trailing = true; // no repeated dimension inside the operand's span
    for (std::size_t i = off; i < rank; ++i)
      trailing = trailing && operand.dims[i - off] == result.dims[i];
    modulo = trailing && !identity ? operand.size() : 0;
  }
  /// The operand element that result element o reads.
  [[nodiscard]] HSPMD_HD std::size_t operator()(std::size_t o) const {
    if (identity)
      return o;
    if (modulo != 0)
      return o % modulo;
    std::size_t at = 0;
    for (std::size_t d = rank; d-- > 0;) {
      at += (o % dims[d]) * stride[d];
      o /= dims[d];
    }
    return at;
  }
};

/// The result elements that read one operand element, for reducing a broadcast's gradient:
/// `first(j)` is the first one, and the others follow by the repeated dimensions.
struct broadcast_fanout {
  std::size_t rank = 0;
  std::size_t op_dims[graph::max_rank]{};    // operand dims aligned to the result (1 if absent)
  std::size_t out_stride[graph::max_rank]{}; // the result's row-major strides
  std::size_t rep_rank = 0;                  // repeated dimensions: extents and result strides
  std::size_t rep_extent[graph::max_rank]{};
  std::size_t rep_stride[graph::max_rank]{};
  std::size_t count = 1; // result elements per operand element
  bool identity = true;  // the operand has the result's shape

  broadcast_fanout() = default;
  broadcast_fanout(const hspmd::shape& operand, const hspmd::shape& result) {
    identity = operand.dims == result.dims;
    rank = result.rank();
    const std::size_t off = rank - operand.rank();
    std::size_t s = 1;
    for (std::size_t i = rank; i-- > 0;) {
      out_stride[i] = s;
      s *= result.dims[i];
      op_dims[i] = i >= off ? operand.dims[i - off] : 1;
    }
    for (std::size_t i = 0; i < rank; ++i)
      if (op_dims[i] != result.dims[i]) {
        rep_extent[rep_rank] = result.dims[i];
        rep_stride[rep_rank++] = out_stride[i];
        count *= result.dims[i];
      }
  }
  /// The first result element that reads operand element j.
  [[nodiscard]] HSPMD_HD std::size_t first(std::size_t j) const {
    if (identity)
      return j;
    std::size_t at = 0;
    for (std::size_t d = rank; d-- > 0;) {
      at += (j % op_dims[d]) * out_stride[d];
      j /= op_dims[d];
    }
    return at;
  }
  /// The r-th result element (r < count) that reads the operand element whose first is `base`.
  [[nodiscard]] HSPMD_HD std::size_t nth(std::size_t base, std::size_t r) const {
    for (std::size_t d = rep_rank; d-- > 0;) {
      base += (r % rep_extent[d]) * rep_stride[d];
      r /= rep_extent[d];
    }
    return base;
  }
};

} // namespace hspmd::exec
