"""Any ``AgentEnv`` as an OpenEnv environment, served by OpenEnv's own server code.

:func:`build_app` wraps the environment in an OpenEnv ``Environment`` (one instance per
WebSocket session: ``SUPPORTS_CONCURRENT_SESSIONS``) and gives it to OpenEnv's
``create_app``, so ``/ws``, ``/reset``, ``/step``, ``/state``, ``/schema``, ``/health``
and ``/metadata`` are OpenEnv's, and any OpenEnv client drives it. The wire types:

- action :class:`AgentAction`: ``text``, the policy's reply (tool calls in the
  environment's format, Hermes ``<tool_call>`` by default, or the final answer);
- observation :class:`AgentObservation`: ``messages``, the new chat messages (``role``,
  ``content``, ``name`` for tool results), ``tools`` (the OpenAI schemas of the
  environment's tools, on every observation), ``truncated``, ``tool_errors`` and
  ``reward_components``; plus OpenEnv's ``reward`` (the step's) and ``done``
  (terminated or truncated);
- reset data: ``seed`` (the same seed, the same task) and ``split`` ("train" or "eval");
- state: ``episode_id``, ``step_count``, ``split``; and ``demonstration``, the
  environment's scripted next action, only when the server runs with
  ``expose_demonstrations`` (for ``check-env`` and ``sft`` through the server; never
  let a policy read it).

The environment's own errors (a step after the end, a constructor that fails) reach the
client as OpenEnv error replies. A WebSocket idle past its timeout is closed (its session
freed); ``POST /step``, stateless in OpenEnv, is refused with a 400 naming ``/ws``; an
environment with ``@subagent`` tools is refused at start-up (:func:`unservable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from uuid import uuid4

from agentrl.config.extras import require
from agentrl.envs.agent_env import has_demonstration

_types = require("openenv.core.env_server.types", "agentrl serve-env")
_interfaces = require("openenv.core.env_server.interfaces", "agentrl serve-env")
from pydantic import Field  # noqa: E402 - pydantic comes with openenv, checked just above


class AgentAction(_types.Action):
    """The policy's reply to an agentrl environment."""

    text: str = Field(..., description="The policy's reply: tool calls in the environment's "
                      "format (Hermes <tool_call> JSON by default) or the final answer")


class AgentObservation(_types.Observation):
    """What an agentrl environment shows after reset or a step."""

    messages: list[dict[str, Any]] = Field(
        default_factory=list, description="New chat messages: role, content, name (tools)")
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="OpenAI function schemas of the environment's tools")
    truncated: bool = Field(default=False, description="The episode hit its turn limit")
    tool_errors: dict[str, int] = Field(default_factory=dict,
                                        description="Failed tool calls of this step by kind")
    reward_components: dict[str, float] = Field(
        default_factory=dict, description="Named parts of the reward (for logging)")


class AgentState(_types.State):
    """A session's state."""

    split: str = "train"
    demonstration: str | None = None


def message_dicts(messages: list[Any]) -> list[dict[str, Any]]:
    """``Message`` structs as the wire's dicts (``name`` only on tool messages)."""
    out = []
    for m in messages:
        item = {"role": m.role, "content": m.content}
        if m.name:
            item["name"] = m.name
        out.append(item)
    return out


class ServedAgentEnv(_interfaces.Environment):
    """One AgentEnv instance behind OpenEnv's ``Environment`` interface (one per session)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, factory: Callable[[], Any], name: str,
                 expose_demonstrations: bool = False) -> None:
        """``factory()`` builds the AgentEnv; ``name`` is its id, for ``/metadata``."""
        super().__init__()
        self.env = factory()
        self.name = name
        self.expose_demonstrations = expose_demonstrations
        self.transcript: list[Any] = []
        self._state = AgentState(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              split: str = "train", **kwargs: Any) -> AgentObservation:
        """``env.reset(seed=seed, options={"split": split})``."""
        messages, _ = self.env.reset(seed=seed, options={"split": split})
        self.transcript = list(messages)
        self._state = AgentState(episode_id=episode_id or str(uuid4()), step_count=0,
                                 split=split)
        return AgentObservation(messages=message_dicts(messages), tools=self.env.tool_schemas(),
                                reward=0.0, done=False)

    def step(self, action: AgentAction, timeout_s: float | None = None,
             **kwargs: Any) -> AgentObservation:
        """``env.step(action.text)``: the new messages, the step's reward, done."""
        observation, reward, terminated, truncated, info = self.env.step(action.text)
        self._state.step_count += 1
        self.transcript += [_message("assistant", action.text), *observation]
        return AgentObservation(
            messages=message_dicts(observation), tools=self.env.tool_schemas(),
            reward=float(reward), done=bool(terminated or truncated), truncated=bool(truncated),
            tool_errors=dict(info.get("tool_errors") or {}),
            reward_components=dict(info.get("reward_components") or {}))

    @property
    def state(self) -> AgentState:
        """The session's state; with ``expose_demonstrations``, the scripted next action."""
        if self.expose_demonstrations and has_demonstration(self.env):
            self._state.demonstration = self.env.demonstrate(list(self.transcript))
        return self._state

    def get_metadata(self) -> Any:
        """Name, description and the tools, for ``/metadata``."""
        tools = [t.get("function", {}).get("name") for t in self.env.tool_schemas()]
        return _types.EnvironmentMetadata(
            name=self.name, version="1.0.0",
            description=f"agentrl environment {self.name} (agentrl serve-env); tools: "
                        f"{', '.join(map(str, tools)) or 'none'}; actions are the policy's "
                        "text, observations chat messages")

    def close(self) -> None:
        """Close the AgentEnv."""
        self.env.close()


def _message(role: str, content: str) -> Any:
    from agentrl.types import Message

    return Message(role, content)


def unservable(env: Any) -> str | None:
    """Why ``env`` cannot be served over OpenEnv's wire, or None: a ``@subagent`` tool
    opens a thread of its own that the one-conversation wire cannot carry (its call would
    come back empty, with no error)."""
    if getattr(env, "subagents", None):
        return (f"it has @subagent tools ({', '.join(sorted(env.subagents))}), whose threads "
                "OpenEnv's one-conversation wire cannot carry; train it in-process instead")
    return None


def build_app(factory: Callable[[], Any], name: str, max_sessions: int = 64,
              expose_demonstrations: bool = False, idle_timeout_s: float = 300.0) -> Any:
    """OpenEnv's FastAPI app serving ``factory()``'s environment, up to ``max_sessions``
    WebSocket sessions at once (each its own instance), behind :class:`SessionGuard`."""
    server = require("openenv.core.env_server.http_server", "agentrl serve-env")
    app = server.create_fastapi_app(
        lambda: ServedAgentEnv(factory, name, expose_demonstrations), AgentAction,
        AgentObservation, max_concurrent_envs=max_sessions, env_name=name.replace("/", "_"),
        state_cls=AgentState)
    return SessionGuard(app, idle_timeout_s)


STATELESS_STEP = (b'{"detail": "POST /step plays one step on a fresh environment that was '
                  b'never reset; play an episode over the WebSocket route /ws (reset, then '
                  b'step, in one session)"}')


class SessionGuard:
    """The served app, wrapped: a WebSocket whose client sends nothing for
    ``idle_timeout_s`` seconds is closed (code 1001), which ends its session and frees its
    environment, so clients that connect and never send cannot hold every session; and
    OpenEnv's stateless ``POST /step``, which cannot work for an agentrl environment, is
    answered 400 pointing at ``/ws`` instead of a 500 and a traceback."""

    def __init__(self, app: Any, idle_timeout_s: float) -> None:
        """``app``: the ASGI app; ``idle_timeout_s``: seconds (> 0)."""
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s = {idle_timeout_s!r}; it must be > 0 seconds")
        self.app = app
        self.idle_timeout_s = idle_timeout_s

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        """Route one ASGI connection."""
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/step":
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": STATELESS_STEP})
            return
        if scope["type"] == "websocket":
            receive = self._bounded(receive, send)
        await self.app(scope, receive, send)

    def _bounded(self, receive: Callable, send: Callable) -> Callable:
        """``receive`` that closes the socket and reports a disconnect once the client has
        been silent for ``idle_timeout_s``."""

        async def bounded() -> dict:
            try:
                return await asyncio.wait_for(receive(), self.idle_timeout_s)
            except TimeoutError:
                reason = f"idle for {self.idle_timeout_s:g} s"
                try:
                    await send({"type": "websocket.close", "code": 1001, "reason": reason})
                except Exception:  # noqa: BLE001 - the connection is already gone
                    pass
                return {"type": "websocket.disconnect", "code": 1001, "reason": reason}

        return bounded
