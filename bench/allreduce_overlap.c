// Blocking against non-blocking all-reduce under this MPI, sizes 1-64 MiB, two ranks: the
// penalty the executor's overlapped gradient buckets pay (Open MPI's libnbc schedule advances
// only inside MPI calls). Not built by CMake (a plain MPI program, no hspmd):
//   mpicc -O2 bench/allreduce_overlap.c -o /tmp/allreduce_overlap
//   OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun -np 2 /tmp/allreduce_overlap
// Best of 7 per size, the two forms alternating.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv); int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  float* b = malloc(64u << 20); for (size_t i = 0; i < (16u << 20); i++) b[i] = 1;
  for (size_t mib = 1; mib <= 64; mib *= 2) { size_t n = (mib << 20) / 4; double bb = 1e9, nb = 1e9;
    for (int rep = 0; rep < 7; rep++) {
      MPI_Barrier(MPI_COMM_WORLD); double t = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); t = MPI_Wtime() - t; if (t < bb) bb = t;
      MPI_Request r; MPI_Barrier(MPI_COMM_WORLD); t = MPI_Wtime();
      MPI_Iallreduce(MPI_IN_PLACE, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r); MPI_Wait(&r, MPI_STATUS_IGNORE); t = MPI_Wtime() - t; if (t < nb) nb = t; }
    if (rank == 0) printf("%3zu MiB: blocking %6.2f ms, Iallreduce+Wait %6.2f ms (%.2fx)\n", mib, 1e3*bb, 1e3*nb, nb/bb); }
  MPI_Finalize();
}
