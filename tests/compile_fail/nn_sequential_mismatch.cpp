// A sequential model whose second linear layer expects 30 features after a layer producing 20
// (the ReLU between them passes features through).
// hspmd-expect-error: a layer's output features differ from the next layer's input features
// hspmd-expect-error: sequential_layers_do_not_fit<hspmd::nn::detail::layer_index<2>,
// hspmd::nn::detail::layer_outputs<20>, hspmd::nn::detail::next_layer_expects<30> >
#include <hspmd/nn/layers.hpp>

int main() {
#ifdef HSPMD_EXPECT_COMPILE_ERROR
  hspmd::nn::sequential model(hspmd::nn::linear<float, 10, 20>{"a"}, hspmd::nn::relu_layer{},
                              hspmd::nn::linear<float, 30, 5>{"b"});
#else
  hspmd::nn::sequential model(hspmd::nn::linear<float, 10, 20>{"a"}, hspmd::nn::relu_layer{},
                              hspmd::nn::linear<float, 20, 5>{"b"});
#endif
  (void)model;
  return 0;
}
