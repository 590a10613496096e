"""Horovod for PyTorch and TensorFlow (ring-allreduce over Gloo or MPI)."""
