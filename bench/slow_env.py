"""Countdown whose every step first waits ``latency_s`` on the event loop (a slow tool).

The GPU acceptance run's resumed run plays it in place of Countdown so that rank 0's
collection outlasts ``train.collective_timeout_s``: the run finishing then shows that
ranks 1..N wait for rank 0 outside any collective (``agentrl.parallel.groups.wait_for_main``).
Tasks, rewards and tokens are Countdown's: only time passes.
"""

from __future__ import annotations

import asyncio

from environments.countdown import CountdownEnv


class SlowCountdown(CountdownEnv):
    """Countdown; each step awaits ``latency_s`` seconds first (rollouts wait together)."""

    def __init__(self, latency_s: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.latency_s = latency_s

    async def astep(self, action: str):
        """Wait, then Countdown's own step (native async: awaited on the runner's loop)."""
        await asyncio.sleep(self.latency_s)
        return self.step(action)
