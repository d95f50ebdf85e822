"""Generating rollouts: the multi-turn runner, compaction, containment, health, collectors."""
