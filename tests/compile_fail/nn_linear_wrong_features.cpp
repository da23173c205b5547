// A linear layer expecting 128 input features fed a (batch, 256) tensor.
// clang-format off
// hspmd-expect-error: the input's last dimension \(its features\) does not match the layer's input size
// hspmd-expect-error: features_must_match<hspmd::nn::functional::detail::input_features<256>, hspmd::nn::functional::detail::layer_expects<128> >
// clang-format on
#include <hspmd/nn/layers.hpp>

int main() {
  hspmd::nn::tracer t(hspmd::dtype::f32, 4);
  auto x = t.input<float, hspmd::extents<hspmd::batch, 256>>("x");
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  hspmd::nn::linear<float, 128, 10> fc{"fc"};
#else
  hspmd::nn::linear<float, 256, 10> fc{"fc"};
#endif
  auto y = fc(t, x);
  return static_cast<int>(y.extent(1)) - 10;
}
