// hspmd::compiled: the library trainer compiled once, for programs that define HSPMD_COMPILED
// (linking hspmd::compiled does) and so parse only exec/trainer.hpp's declarations.
#include <hspmd/exec/trainer_impl.hpp>

namespace hspmd::exec {

template class trainer<float, adam>;
template class trainer<double, adam>;

} // namespace hspmd::exec
