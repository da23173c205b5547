#pragma once
// Execution traces: the trace-event format and its recorder live in sim/trace.hpp, shared by
// the executor's measured traces and the simulator's predicted ones.

#include <hspmd/sim/trace.hpp>

namespace hspmd::exec {
using sim::chrome_trace;
using sim::trace_kind;
using sim::trace_recorder;
} // namespace hspmd::exec
