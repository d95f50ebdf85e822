"""Training: the step loop, run setup, the update, checkpoints, SFT warm start, preflight."""
