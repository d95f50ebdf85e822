"""Data parallelism on one or many machines: process groups from torchrun, FSDP2 sharding
with fp32 master weights and low-precision compute, ranks waiting on rank 0, and what
each process's allocators and kernel caches keep past its live tensors."""
