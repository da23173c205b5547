#pragma once
// Registry entries of the image ops on (N, C, H, W): conv2d, max pooling, adaptive average
// pooling. Spatial dimensions are not splittable (they would need halos).
//
//   op                   forward FLOPs                           backward FLOPs
//   conv2d               2 N K Ho Wo C R S + N K Ho Wo           4 N K Ho Wo C R S + N K Ho Wo
//                        (the kernel size counts: HAP's cost model left it out)
//   max_pool2d           N C Ho Wo (k^2 - 1) comparisons         N C Ho Wo
//   adaptive_avg_pool2d  one add per input element of each window, + 1 per output; backward alike

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// The input window [begin, end) of output cell i when adaptively pooling `in` cells to `out`.
struct pool_window {
  std::size_t begin = 0;
  std::size_t end = 0;
};
[[nodiscard]] constexpr pool_window adaptive_window(std::size_t i, std::size_t in,
                                                    std::size_t out) {
  return {i * in / out, ((i + 1) * in + out - 1) / out};
}

/// Labels of an image operand or output: batch and channels splittable, the spatial ones not.
inline constexpr void image_labels(signature_builder& b, std::size_t operand) {
  const dims_view& x = b.in(operand);
  b.set_in(operand, {b.make(x[0]), b.make(x[1]), b.make(x[2], false), b.make(x[3], false)});
}

/// x (N, C, H, W), weight (K, C, R, S), bias (K) -> (N, K, Ho, Wo); attrs.dims = {stride, pad}.
template <>
struct op_traits<op::conv2d> {
  static constexpr work rate = work::gemm;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "x (N, C, H, W), weight (K, C, R, S), bias (K); attrs.dims = {stride, padding}";
  static constexpr std::size_t arity = 3;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    const auto& w = v.in(1);
    const auto& a = v.attrs().dims;
    const bool ok_attrs = a.size() == 2 && a[0] > 0;
    const std::size_t pad = ok_attrs ? a[1] : 0;
    if (x.rank() != 4 || w.rank() != 4 || !ok_attrs || w.dims[1] != x.dims[1] ||
        v.in(2).dims != std::vector<std::size_t>{w.dims[0]} || x.dims[2] + 2 * pad < w.dims[2] ||
        x.dims[3] + 2 * pad < w.dims[3])
      v.fail("cannot convolve " + x.to_string() + " with " + w.to_string(),
             "x (N, C, H, W), weight (K, C, R, S) no larger than the padded image, bias (K), "
             "attrs {stride > 0, padding}");
    const std::size_t stride = a[0];
    hspmd::shape out = x;
    out.dims[1] = w.dims[0];
    out.dims[2] = (x.dims[2] + 2 * pad - w.dims[2]) / stride + 1;
    out.dims[3] = (x.dims[3] + 2 * pad - w.dims[3]) / stride + 1;
    return out;
  }
  static node_cost cost(const node_view& v) {
    const auto& w = v.in(1);
    const double per_output = static_cast<double>(w.dims[1] * w.dims[2] * w.dims[3]); // C R S
    node_cost c = v.memory_cost();
    c.forward_flops = 2.0 * v.out_size() * per_output + v.out_size();
    c.backward_flops = 4.0 * v.out_size() * per_output + v.out_size();
    return c;
  }
  // x (N, C, H, W), w (K, C, R, S), b (K) -> (N, K, Ho, Wo); C summed over
  static constexpr void signature(signature_builder& b) {
    image_labels(b, 0);
    auto& s = b.sig();
    const label k = b.make(b.in(1)[0]);
    b.set_in(1, {k, s.in[0][1], b.make(b.in(1)[2], false), b.make(b.in(1)[3], false)});
    if (b.arity() > 2) {
      b.set_in(2, {k});
      s.bias = 2;
    }
    b.set_out({s.in[0][0], k, b.make(b.out()[2], false), b.make(b.out()[3], false)});
    b.sum_over(s.in[0][1]);
    b.linear_in(signature::linearity::each, 1);
  }
  static std::vector<op_example> examples() {
    std::vector<op_example> e;
    for (const auto& [stride, pad] : {std::pair<std::size_t, std::size_t>{1, 0}, {2, 1}, {1, 2}})
      e.push_back({"stride " + std::to_string(stride) + " pad " + std::to_string(pad),
                   {{{2, 3, 5, 6}}, {{4, 3, 3, 2}}, {{4}}},
                   attributes{0.0, {stride, pad}, false}});
    return e;
  }
};

/// Shared signature of the poolings: (N, C, H, W) -> (N, C, Ho, Wo).
inline constexpr void pool_signature(signature_builder& b) {
  image_labels(b, 0);
  auto& s = b.sig();
  b.set_out({s.in[0][0], s.in[0][1], b.make(b.out()[2], false), b.make(b.out()[3], false)});
}

/// Max pooling with a square window: attrs.dims = {kernel, stride}.
template <>
struct op_traits<op::max_pool2d> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "max over square windows of (N, C, H, W); attrs.dims = {kernel, stride}";
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    const auto& a = v.attrs().dims;
    if (x.rank() != 4 || a.size() != 2 || a[0] == 0 || a[1] == 0 || x.dims[2] < a[0] ||
        x.dims[3] < a[0])
      v.fail("cannot pool " + x.to_string(),
             "x (N, C, H, W) at least one kernel wide, attrs {kernel, stride} > 0");
    hspmd::shape out = x;
    out.dims[2] = (x.dims[2] - a[0]) / a[1] + 1;
    out.dims[3] = (x.dims[3] - a[0]) / a[1] + 1;
    return out;
  }
  static node_cost cost(const node_view& v) {
    const double k = static_cast<double>(v.attrs().dims[0]);
    node_cost c = v.memory_cost();
    c.forward_flops = v.out_size() * (k * k - 1.0);
    c.backward_flops = v.out_size();
    return c;
  }
  static constexpr void signature(signature_builder& b) { pool_signature(b); }
  static std::vector<op_example> examples() {
    return {{"", {{{2, 2, 6, 5}}}, attributes{0.0, {2, 2}, false}}};
  }
};

/// Adaptive average pooling to attrs.dims = {Ho, Wo}: cell (i, j) averages the window
/// `adaptive_window(i, H, Ho)` x `adaptive_window(j, W, Wo)`.
template <>
struct op_traits<op::adaptive_avg_pool2d> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "(N, C, H, W) -> (N, C, attrs.dims[0], attrs.dims[1]) by averaging adaptive windows";
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    const auto& a = v.attrs().dims;
    if (x.rank() != 4 || a.size() != 2 || a[0] == 0 || a[1] == 0)
      v.fail("cannot pool " + x.to_string(), "x (N, C, H, W) and attrs {Ho, Wo} > 0");
    hspmd::shape out = x;
    out.dims[2] = a[0];
    out.dims[3] = a[1];
    return out;
  }
  static node_cost cost(const node_view& v) {
    const auto& x = v.in(0);
    const auto& o = v.out();
    double window_elems = 0.0; // sum over output cells of their window sizes
    for (std::size_t i = 0; i < o.dims[2]; ++i)
      for (std::size_t j = 0; j < o.dims[3]; ++j) {
        const auto r = adaptive_window(i, x.dims[2], o.dims[2]);
        const auto c = adaptive_window(j, x.dims[3], o.dims[3]);
        window_elems += static_cast<double>((r.end - r.begin) * (c.end - c.begin));
      }
    const double planes = static_cast<double>(x.dims[0] * x.dims[1]);
    node_cost c = v.memory_cost();
    c.forward_flops = planes * window_elems + v.out_size();
    c.backward_flops = planes * window_elems + v.out_size();
    return c;
  }
  static constexpr void signature(signature_builder& b) {
    pool_signature(b);
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() {
    return {{"up", {{{1, 2, 2, 3}}}, attributes{0.0, {7, 7}, false}},
            {"down", {{{1, 2, 9, 7}}}, attributes{0.0, {4, 3}, false}}};
  }
};

} // namespace hspmd::graph
