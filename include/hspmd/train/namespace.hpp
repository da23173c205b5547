#pragma once
// The train/ wing's namespace. The trainer and its services (train/) are built on the runtime
// (exec/): inside hspmd::train the runtime's names are found unqualified, its details as
// train::detail's. Programs written before the wing name the trainer's entities hspmd::exec::X
// (train::trainer, train::train_options, train::save_checkpoint, ...): those spellings keep working
// through the directive below; new code writes hspmd::train::X.

namespace hspmd::exec::detail {}
namespace hspmd::train::detail {}

namespace hspmd::train {
using namespace hspmd::exec; // NOLINT(google-build-using-namespace): the layer below
namespace detail {
using namespace hspmd::exec::detail; // NOLINT(google-build-using-namespace)
} // namespace detail
} // namespace hspmd::train

namespace hspmd::exec {
using namespace hspmd::train; // NOLINT(google-build-using-namespace): the names before train/
} // namespace hspmd::exec
