"""agentrl: reinforcement learning for multi-turn, tool-using LLM agents.

The data flow of one training step is drawn in docs/architecture.md:
sampler → rollouts (with compaction) → reassembler → advantages → packing → trainer.
The public names below are imported lazily, so that ``agentrl --help`` stays fast; the
environment registry (Gymnasium and the built-in ids, no torch) is imported eagerly.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "make": "agentrl.envs.registry",
    "AgentEnv": "agentrl.envs.agent_env",
    "Task": "agentrl.envs.agent_env",
    "Grade": "agentrl.envs.agent_env",
    "tool": "agentrl.envs.tools",
    "subagent": "agentrl.envs.subagents",
    "format_call": "agentrl.envs.tools",
    "Message": "agentrl.types",
    "load_config": "agentrl.config",
}

__all__ = [*_EXPORTS, "__version__"]

# Register the built-in environments (and installed packages' gymnasium.envs plugins) with
# Gymnasium, so `gymnasium.make("agentrl/Countdown-v0")` works after `import agentrl`.
importlib.import_module("agentrl.envs.registry")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
