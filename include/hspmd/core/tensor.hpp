#pragma once
// A dense, row-major tensor in host memory with typed extents.
//
//     tensor<float, extents<batch, 768>> x(32);   // (32, 768), zero-filled
//     x(0, 5) = 1.0F;

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/extents.hpp>

#include <array>
#include <cassert>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace hspmd {

/// Dense row-major tensor of `T` with extents `E`, owning its host storage.
template <element_type T, extents_type E>
class tensor {
public:
  using value_type = T;
  using extents_type = E;
  /// The runtime element type.
  static constexpr dtype element_dtype = dtype_of<T>;

  /// A zero-filled tensor of all-static extents.
  tensor() requires(E::rank_dynamic() == 0) : data_(E{}.size()) {}
  /// A tensor of the given extents, every element `value`.
  explicit tensor(const E& e, T value = T{}) : extents_(e), data_(e.size(), value) {}
  /// Zero-filled, with one size per runtime dimension: `tensor<float, extents<batch, 4>> x(32)`.
  template <std::integral... Ds>
  requires(sizeof...(Ds) == E::rank_dynamic() && E::rank_dynamic() > 0) explicit tensor(Ds... ds)
      : tensor(E(ds...)) {}

  [[nodiscard]] static constexpr std::size_t rank() noexcept { return E::rank(); }
  [[nodiscard]] const E& extents() const noexcept { return extents_; }
  [[nodiscard]] std::size_t extent(std::size_t i) const noexcept { return extents_.extent(i); }
  /// Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return data_.size(); }
  /// Bytes of element storage.
  [[nodiscard]] std::size_t size_bytes() const noexcept { return data_.size() * sizeof(T); }
  [[nodiscard]] hspmd::shape shape() const { return extents_.shape(); }

  [[nodiscard]] T* data() noexcept { return data_.data(); }
  [[nodiscard]] const T* data() const noexcept { return data_.data(); }
  /// All elements in row-major order.
  [[nodiscard]] std::span<T> values() noexcept { return data_; }
  [[nodiscard]] std::span<const T> values() const noexcept { return data_; }

  /// Element by flat row-major index (unchecked in release builds).
  [[nodiscard]] T& operator[](std::size_t i) noexcept {
    assert(i < data_.size());
    return data_[i];
  }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept {
    assert(i < data_.size());
    return data_[i];
  }

  /// Element by multi-index, one index per dimension (unchecked in release builds).
  template <std::integral... Is>
  requires(sizeof...(Is) == E::rank()) [[nodiscard]] T& operator()(Is... is) noexcept {
    return data_[flat_index({static_cast<std::size_t>(is)...})];
  }
  template <std::integral... Is>
  requires(sizeof...(Is) == E::rank()) [[nodiscard]] const T& operator()(Is... is) const noexcept {
    return data_[flat_index({static_cast<std::size_t>(is)...})];
  }

  /// Element by multi-index with bounds checks: throws `shape_error` naming the bad index.
  template <std::integral... Is>
  requires(sizeof...(Is) == E::rank()) [[nodiscard]] T& at(Is... is) {
    const std::array<std::size_t, E::rank()> idx{static_cast<std::size_t>(is)...};
    const std::array<bool, E::rank()> negative{is_negative(is)...};
    for (std::size_t d = 0; d < E::rank(); ++d)
      if (negative[d] || idx[d] >= extent(d))
        throw shape_error("tensor::at",
                          "index " + std::to_string(d) + " is out of range for shape " +
                              shape().to_string(),
                          "indices run from 0 to size - 1");
    return data_[flat_index(idx)];
  }

  /// Same extents and the same elements, bit for bit (no tolerance).
  [[nodiscard]] friend bool operator==(const tensor& a, const tensor& b) noexcept {
    return a.extents_ == b.extents_ && a.data_ == b.data_;
  }

private:
  template <std::integral I>
  static constexpr bool is_negative(I i) noexcept {
    if constexpr (std::signed_integral<I>)
      return i < 0;
    else
      return false;
  }

  [[nodiscard]] std::size_t
  flat_index(const std::array<std::size_t, E::rank()>& idx) const noexcept {
    std::size_t flat = 0;
    for (std::size_t d = 0; d < E::rank(); ++d) {
      assert(idx[d] < extent(d));
      flat = flat * extent(d) + idx[d];
    }
    return flat;
  }

  [[no_unique_address]] E extents_;
  std::vector<T> data_;
};

namespace detail {
template <class X>
inline constexpr bool is_tensor_v = false;
template <element_type T, extents_type E>
inline constexpr bool is_tensor_v<tensor<T, E>> = true;
} // namespace detail

/// Any `hspmd::tensor<T, E>`.
template <class X>
concept tensor_type = detail::is_tensor_v<X>;

} // namespace hspmd
