"""What the ecosystem tests' training runs share."""

TINY_BATCH = """
[batch]
rollout_batch_size = 2
n_samples_per_prompt = 2
global_batch_size = 4
"""
"""Two environments, one group of 2 rollouts each per collection: one update of 4."""
