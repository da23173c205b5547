// The main() of hspmd's MPI test executables: every rank runs the same Catch2 session (so the
// test cases, and the collectives in them, run in the same order everywhere). Rank 0 reports to
// the terminal; other ranks write to a file that is shown only when that rank failed. The exit
// code is the worst over all ranks, so a failure on any rank fails the test on every rank.
// (Catch2 itself: catch_impl.cpp.)
#include "run_catch.hpp"

#include <hspmd/comm/mpi/environment.hpp>

#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

int main(int argc, char** argv) {
  hspmd::prefer_mpi_settings(); // what hspmd::mpi_environment applies
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  std::vector<std::string> args(argv, argv + argc);
  const auto out_file = std::filesystem::temp_directory_path() /
                        ("hspmd-mpi-test-" + std::to_string(getpid()) + ".txt");
  if (rank != 0) {
    args.emplace_back("--out");
    args.push_back(out_file.string());
  }
  std::vector<const char*> cargs;
  for (const auto& a : args)
    cargs.push_back(a.c_str());

  int rc = hspmd::test::run_catch(static_cast<int>(cargs.size()), cargs.data());

  if (rank != 0) {
    if (rc != 0) {
      std::ifstream in(out_file);
      std::stringstream text;
      text << in.rdbuf();
      std::cerr << "---- rank " << rank << " of " << size << " failed; its report:\n"
                << text.str() << std::flush;
    }
    std::filesystem::remove(out_file);
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("hspmd MPI test: %d rank(s), %s\n", size,
                worst == 0 ? "all passed" : "FAILED on at least one rank");
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
