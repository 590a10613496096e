"""MPI through mpi4py: the transport Horovod and the launchers lean on."""
