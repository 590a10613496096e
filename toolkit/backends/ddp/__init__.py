"""Plain PyTorch DistributedDataParallel: the reference engine."""
