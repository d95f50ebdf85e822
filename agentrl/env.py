"""Stable alias of ``agentrl.envs.agent_env``: ``from agentrl.env import AgentEnv`` works."""
from agentrl.envs.agent_env import *  # noqa: F403
