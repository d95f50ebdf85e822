"""The environment author's API: AgentEnv, @tool, @subagent, registry, context budget,
demonstrations.

The names below are the stable API (``from agentrl.envs import AgentEnv, tool``; the same
names are importable from ``agentrl``).
"""

from agentrl.envs.agent_env import AgentEnv
from agentrl.envs.registry import make
from agentrl.envs.subagents import subagent
from agentrl.envs.task import Grade, Task
from agentrl.envs.tools import format_call, tool

__all__ = ["AgentEnv", "Grade", "Task", "format_call", "make", "subagent", "tool"]
