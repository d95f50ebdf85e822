"""Data parallelism on one or many machines: process groups from torchrun, FSDP2 sharding
with fp32 master weights and low-precision compute, and ranks waiting on rank 0."""
