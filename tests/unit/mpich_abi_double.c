/* A library that answers MPI_Get_library_version as MPICH does and has the
 * soname of MPICH's ABI (libmpi.so.12, set by the link), standing in for an
 * installed MPICH in mpi_table_test: Squall must refuse it, by name, before
 * calling anything else. */
#include <stdio.h>

__attribute__((visibility("default"))) int MPI_Get_library_version(char* version, int* length) {
  *length = snprintf(version, 256, "MPICH Version:\t4.1.2\nMPICH Release date:\tunreleased");
  return 0;
}
