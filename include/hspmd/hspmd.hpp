#pragma once
// hspmd: SPMD training on clusters of mixed devices. The umbrella header.
//
// Hardware-free layers are always included. The MPI backend is included when the program
// links `hspmd::mpi` (or `hspmd::hspmd`), which defines HSPMD_HAS_MPI; the NCCL backend when it
// links `hspmd::nccl`, which defines HSPMD_HAS_NCCL.

#include <hspmd/core/collective_cost.hpp>
#include <hspmd/core/collectives.hpp>
#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/extents.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/core/partition.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/core/shape_rules.hpp>
#include <hspmd/core/sharded.hpp>
#include <hspmd/core/tensor.hpp>
#include <hspmd/core/tensor_ops.hpp>

#include <hspmd/io/json_input.hpp>

#include <hspmd/cluster/changes.hpp>
#include <hspmd/cluster/cluster.hpp>
#include <hspmd/cluster/cluster_file.hpp>

#include <hspmd/data/cifar10.hpp>
#include <hspmd/data/prefetch.hpp>
#include <hspmd/data/text.hpp>
#include <hspmd/data/tokens.hpp>

#include <hspmd/lp/problem.hpp>
#include <hspmd/lp/simplex.hpp>

#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/graph/rules.hpp>
#include <hspmd/graph/signature.hpp>
#include <hspmd/graph/stages.hpp>

#include <hspmd/nn/layers.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>
#include <hspmd/nn/transformer.hpp>

#include <hspmd/models/bert.hpp>
#include <hspmd/models/llama.hpp>
#include <hspmd/models/mlp.hpp>
#include <hspmd/models/vgg.hpp>
#include <hspmd/models/vit.hpp>
#include <hspmd/models/zoo.hpp>

#include <hspmd/synth/cost.hpp>
#include <hspmd/synth/hierarchical.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/ratio_lp.hpp>
#include <hspmd/synth/search.hpp>
#include <hspmd/synth/synthesize.hpp>
#include <hspmd/synth/transfer.hpp>

#include <hspmd/program/pipeline.hpp>
#include <hspmd/program/pipeline_plan.hpp>

#if defined(HSPMD_HAS_BLAS)
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/hierarchical.hpp>
#include <hspmd/exec/op_profile.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/pipeline.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/kernels/box.hpp>
#include <hspmd/kernels/registry.hpp>
#include <hspmd/program/layout.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/train/option_checks.hpp>
#include <hspmd/train/option_table.hpp>
#include <hspmd/train/pipeline_checkpoint.hpp>
#include <hspmd/train/profile.hpp>
#include <hspmd/train/trainer.hpp>
#endif

#include <hspmd/comm/calibrate.hpp>
#include <hspmd/comm/communicator.hpp>
#include <hspmd/comm/debug.hpp>
#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/comm/sfb.hpp>

#if defined(HSPMD_HAS_MPI)
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>
#endif
#if defined(HSPMD_HAS_NCCL)
#include <hspmd/comm/nccl/communicator.hpp>
#endif

/// Library version, major * 10000 + minor * 100 + patch.
#define HSPMD_VERSION 100
