#pragma once
// The ops of the IR, one line each: X(op, front end). This list is the registry's index: the
// enum `graph::op`, the op names (the identifier, in JSON and tables) and the typed functions
// of nn::functional come from it; every other fact of an op lives in its `op_traits`
// specialization in graph/ops/<family>.hpp, and its kernels in kernels/<family>.hpp.
//
// The front end says which typed function nn/ops.hpp generates for the op:
//   unary   f(x) -> a value with x's extents and the placement the rule table gives
//   none    the op has a hand-written typed function (or none: inputs, parameters)
// New ops go at the end (the enum's values index per-op tables such as the profile).

#define HSPMD_GRAPH_OPS(X)                                                                         \
  X(input, none)                                                                                   \
  X(parameter, none)                                                                               \
  X(matmul, none)                                                                                  \
  X(linear, none)                                                                                  \
  X(batched_matmul, none)                                                                          \
  X(add, none)                                                                                     \
  X(sub, none)                                                                                     \
  X(mul, none)                                                                                     \
  X(scale, none)                                                                                   \
  X(relu, unary)                                                                                   \
  X(gelu, unary)                                                                                   \
  X(tanh, unary)                                                                                   \
  X(sigmoid, unary)                                                                                \
  X(softmax, unary)                                                                                \
  X(log_softmax, unary)                                                                            \
  X(layer_norm, none)                                                                              \
  X(embedding, none)                                                                               \
  X(cross_entropy, none)                                                                           \
  X(sum, none)                                                                                     \
  X(mean, none)                                                                                    \
  X(reshape, none)                                                                                 \
  X(permute, none)                                                                                 \
  X(dropout, none)                                                                                 \
  X(slice, none)                                                                                   \
  X(concat, none)                                                                                  \
  X(conv2d, none)                                                                                  \
  X(max_pool2d, none)                                                                              \
  X(adaptive_avg_pool2d, none)                                                                     \
  X(broadcast, none)                                                                               \
  X(moe_dispatch, none)                                                                            \
  X(moe_combine, none)                                                                             \
  X(silu, unary)                                                                                   \
  X(rms_norm, none)                                                                                \
  X(rotary, none)                                                                                  \
  X(swiglu, none)                                                                                  \
  X(attention, none)
