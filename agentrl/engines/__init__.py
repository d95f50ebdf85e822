"""Inference at scale: replicas behind a router, HTTP serving, remote replicas, weight sync."""
