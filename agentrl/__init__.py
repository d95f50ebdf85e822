"""agentrl: reinforcement learning for multi-turn, tool-using LLM agents.

The data flow of one training step is drawn in docs/architecture.md:
sampler → rollouts (with compaction) → reassembler → advantages → packing → trainer.
"""

__version__ = "0.1.0"
