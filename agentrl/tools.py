"""Stable alias of ``agentrl.envs.tools`` (``from agentrl.tools import tool`` keeps working)."""
from agentrl.envs.tools import *  # noqa: F403
