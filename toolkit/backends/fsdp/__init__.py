"""PyTorch FSDP2 (fully_shard): sharded data parallelism in torch itself."""
