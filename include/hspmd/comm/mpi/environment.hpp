#pragma once
// Owning MPI's lifetime in a program's main().

#include <hspmd/comm/mpi/check.hpp>

#include <mpi.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace hspmd {

/// The environment variable through which Open MPI takes the algorithm of its non-blocking
/// all-reduce (component libnbc): 1 is the ring.
inline constexpr const char* libnbc_iallreduce_variable =
    "OMPI_MCA_coll_libnbc_iallreduce_algorithm";

/// MPI settings hspmd prefers, applied to this process's environment before MPI_Init (MPI reads
/// them there); a variable the user has set is kept. Under Open MPI the non-blocking all-reduce,
/// which carries the executor's overlapped gradient buckets, runs the ring: libnbc's own pick at
/// two and four ranks (recursive doubling) took 1.3-1.7x the blocking MPI_Allreduce at 1-64 MiB
/// on a two-core host, the ring 0.95-1.1x (bench/allreduce_overlap.c, docs/collectives.md).
/// `mpi_environment` calls it; a program that calls MPI_Init itself calls it first.
inline void prefer_mpi_settings() {
#if defined(OPEN_MPI) && OPEN_MPI
  ::setenv(libnbc_iallreduce_variable, "1", 0); // 0: an existing value stays
#endif
}

/// An MPI control variable's integer value read through the MPI tool interface (MPI_T), or none
/// where this MPI has no such variable, it is not an integer, or MPI_T is unavailable. Call
/// between MPI_Init and MPI_Finalize.
[[nodiscard]] inline std::optional<int> mpi_control_variable(const std::string& name) {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS)
    return std::nullopt;
  std::optional<int> value;
  int count = 0;
  MPI_T_cvar_get_num(&count);
  for (int i = 0; i < count && !value; ++i) {
    std::vector<char> text(256);
    int name_len = static_cast<int>(text.size());
    int verbosity = 0;
    int bind = 0;
    int scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype = MPI_T_ENUM_NULL;
    if (MPI_T_cvar_get_info(i, text.data(), &name_len, &verbosity, &type, &enumtype, nullptr,
                            nullptr, &bind, &scope) != MPI_SUCCESS ||
        name != text.data() || type != MPI_INT || bind != MPI_T_BIND_NO_OBJECT)
      continue;
    MPI_T_cvar_handle handle = nullptr;
    int elements = 0;
    if (MPI_T_cvar_handle_alloc(i, nullptr, &handle, &elements) != MPI_SUCCESS)
      continue;
    int v = 0;
    if (elements == 1 && MPI_T_cvar_read(handle, &v) == MPI_SUCCESS)
      value = v;
    MPI_T_cvar_handle_free(&handle);
  }
  MPI_T_finalize();
  return value;
}

/// Initializes MPI (MPI_THREAD_FUNNELED) unless it already is, and finalizes it on destruction
/// if this object initialized it. Create one at the top of main(), before any communicator.
/// Before initializing it applies `prefer_mpi_settings`.
class mpi_environment {
public:
  mpi_environment(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0)
      return;
    prefer_mpi_settings();
    int provided = 0;
    HSPMD_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), -1);
    owner_ = true;
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  mpi_environment(mpi_environment&&) = delete;
  mpi_environment& operator=(mpi_environment&&) = delete;
  ~mpi_environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && finalized == 0)
      MPI_Finalize();
  }

private:
  bool owner_ = false;
};

} // namespace hspmd
