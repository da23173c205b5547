// hspmd::cuda: registers the trainer's "cuda" device engine (train/cuda_engine.cuh) for
// float and double with Adam and SGD when this object is linked into a program. nvcc only.
#include <hspmd/exec/optim.hpp>
#include <hspmd/train/cuda_engine.cuh>

namespace hspmd::train {

namespace {
const register_device_engine<float, adam> float_adam{cuda_engine_entry<float, adam>()};
const register_device_engine<double, adam> double_adam{cuda_engine_entry<double, adam>()};
const register_device_engine<float, sgd> float_sgd{cuda_engine_entry<float, sgd>()};
const register_device_engine<double, sgd> double_sgd{cuda_engine_entry<double, sgd>()};
} // namespace

} // namespace hspmd::train
