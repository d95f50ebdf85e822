"""OpenEnv environments written against OpenEnv's own interfaces and served by its own
``create_fastapi_app``, for the consumer tests: one that fails on demand, one with a
structured action, and an app without the WebSocket route.

Serve one with ``python -m uvicorn tests.ecosystem.openenv_apps:faulty_app --port P``
from the repository root; ``combo_app`` serves four under ``/faulty``, ``/small`` (two
sessions at most), ``/grid`` and ``/http`` (no WebSocket), one server start for all.
"""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class SayAction(Action):
    message: str = Field(..., description="What to say")


class SayObservation(Observation):
    text: str = ""
    messages: Any = None


class FaultyEnvironment(Environment):
    """Answers "ok" with reward 1 and done; "boom" raises, "sleep" sleeps 5 s, "exit"
    kills the server, "bad" sends an observation whose messages are not a list; anything
    else is echoed with reward 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> SayObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return SayObservation(text=f"task {seed}: say ok", reward=0.0)

    def step(self, action: SayAction, timeout_s: float | None = None,
             **kwargs: Any) -> SayObservation:
        self._state.step_count += 1
        said = action.message.strip()
        if said == "boom":
            raise RuntimeError("the environment exploded")
        if said == "sleep":
            time.sleep(5)
        if said == "exit":
            os._exit(1)
        if said == "bad":
            return SayObservation(messages="not a list of messages")
        if said == "ok":
            return SayObservation(text="well said", reward=1.0, done=True)
        return SayObservation(text=f"you said {said!r}", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class MoveAction(Action):
    dx: int = Field(..., description="Steps right (negative: left)")
    dy: int = Field(..., description="Steps up (negative: down)")


class GridObservation(Observation):
    position: list[int] = Field(default_factory=lambda: [0, 0])
    goal: list[int] = Field(default_factory=lambda: [0, 0])


class GridEnvironment(Environment):
    """Reach the goal; a structured action of two integers; reward 1 on arrival."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.position, self.goal = [0, 0], [0, 0]
        self.steps = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> GridObservation:
        seed = seed or 0
        self.position, self.goal, self.steps = [0, 0], [seed % 3 + 1, seed % 2 + 1], 0
        return GridObservation(position=list(self.position), goal=list(self.goal))

    def step(self, action: MoveAction, timeout_s: float | None = None,
             **kwargs: Any) -> GridObservation:
        self.steps += 1
        self.position = [self.position[0] + action.dx, self.position[1] + action.dy]
        arrived = self.position == self.goal
        return GridObservation(position=list(self.position), goal=list(self.goal),
                               reward=1.0 if arrived else 0.0, done=arrived)

    @property
    def state(self) -> State:
        return State(step_count=self.steps)


faulty_app = create_fastapi_app(FaultyEnvironment, SayAction, SayObservation,
                                max_concurrent_envs=8)
small_app = create_fastapi_app(FaultyEnvironment, SayAction, SayObservation,
                               max_concurrent_envs=2)
grid_app = create_fastapi_app(GridEnvironment, MoveAction, GridObservation,
                              max_concurrent_envs=8)
http_only_app = create_fastapi_app(FaultyEnvironment, SayAction, SayObservation,
                                   max_concurrent_envs=8)
http_only_app.router.routes = [r for r in http_only_app.router.routes
                               if getattr(r, "path", None) != "/ws"]

combo_app = FastAPI()
combo_app.get("/health")(lambda: {"status": "healthy"})  # what a local start waits for
for _path, _app in (("/faulty", faulty_app), ("/small", small_app), ("/grid", grid_app),
                    ("/http", http_only_app)):
    combo_app.mount(_path, _app)
