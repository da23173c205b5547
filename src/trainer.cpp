// hspmd::compiled: the library trainer compiled once, for programs that define HSPMD_COMPILED
// (linking hspmd::compiled does) and so parse only train/trainer.hpp's declarations.
#include <hspmd/train/trainer_impl.hpp>

namespace hspmd::train {

template class trainer<float, adam>;
template class trainer<double, adam>;

} // namespace hspmd::train
