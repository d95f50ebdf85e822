"""Inference: the engine protocol, the built-in and vLLM engines, router, servers, weight sync."""
