// Catch2's implementation, compiled once for every test executable; the unit tests' main
// (catch_main.cpp) and the MPI tests' main (mpi_main.cpp) run it through run_catch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "run_catch.hpp"

namespace hspmd::test {

int run_catch(int argc, const char* const* argv) {
  Catch::Session session;
  const int rc = session.applyCommandLine(argc, argv);
  return rc != 0 ? rc : session.run();
}

} // namespace hspmd::test
