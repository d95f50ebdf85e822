"""Rollouts as readable transcripts: sampled during training, written as JSONL in the run
folder, rendered in the terminal (``agentrl inspect RUN_DIR``) and as one HTML page
(``agentrl view RUN_DIR``)."""
