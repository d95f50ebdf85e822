"""Generating rollouts: inference engines, the multi-turn runner, compaction, dynamic sampling."""
