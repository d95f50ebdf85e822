"""An environment whose tool calls take 50 ms: a stand-in for a real API or sandbox.

``SlowToolCalculator`` is the built-in Calculator, except that every tool call waits
``latency_s`` (default 0.05 s) before its result comes back, as a call over the network
would. The wait is an ``asyncio.sleep`` (native async I/O), so the rollout runner's loop
keeps serving other rollouts meanwhile. Used by ``bench/async.py``; in a config::

    [[environments]]
    id = "bench.slow_tools:SlowToolCalculator"
    kwargs = { latency_s = 0.05 }
"""

from __future__ import annotations

import asyncio
from typing import Any

from environments.calculator import CalculatorEnv


class SlowToolCalculator(CalculatorEnv):
    """Calculator with ``latency_s`` seconds of waiting per tool call."""

    def __init__(self, latency_s: float = 0.05, **kwargs: Any) -> None:
        """``latency_s``: seconds each tool call waits; other kwargs as Calculator's."""
        super().__init__(**kwargs)
        if latency_s < 0:
            raise ValueError(f"latency_s is {latency_s}; it must be >= 0")
        self.latency_s = latency_s

    async def astep(self, action: str) -> tuple[list[Any], float, bool, bool, dict]:
        """``step`` (cheap), then the tool calls' waiting, without blocking the loop."""
        result = self.step(action)
        calls = result[4].get("num_tool_calls", 0)
        if calls:
            await asyncio.sleep(self.latency_s * calls)
        return result
