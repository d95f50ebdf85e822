"""Any OpenEnv environment as an ``AgentEnv``: ``agentrl/OpenEnv-v0`` and ``openenv/NAME``.

Where the server comes from (exactly one of):

- ``url = "http://host:8000"``: a server already running (a Hugging Face Space, a
  container, ``agentrl serve-env``);
- ``command = "python -m uvicorn server.app:app --port {port}"`` (and ``cwd``): a command
  that starts one; agentrl picks the port, waits for ``/health``, shares the server among
  this process's sessions and stops it with the process (also when the process is
  killed), see :mod:`agentrl.envs.adapters.openenv_launch`;
- ``package = "echo_env"``, or the id ``openenv/echo_env``: an installed OpenEnv
  environment package, served the same way.

Each instance is one session on the server (a WebSocket through OpenEnv's own client,
HTTP when the server offers no ``/ws``): the runner builds one instance per concurrent
rollout and closes it on every path; a killed trainer's connections close with its
process, and the server drops their environments. Text becomes actions and observations
become messages as :mod:`agentrl.envs.adapters.openenv_mapping` says, from the server's
``/schema``. The step reward and ``done`` pass through (``done`` is ``terminated``;
``truncated`` comes from ``max_turns``). Held-out tasks: ``reset(seed, split="eval")``
sends ``eval_reset_kwargs`` when given (e.g. ``{ split = "test" }`` for OpenEnv's task
API), otherwise the seed plus ``eval_seed_offset``. Every server failure invalidates the
rollout with a named kind (:mod:`agentrl.envs.adapters.remote`); nothing the policy writes
does. Keep ``timeout_s`` below ``rollout.step_timeout_s``, so a slow server reads
``env_server_timeout``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any, Literal

import gymnasium
import msgspec

from agentrl.config.extras import require
from agentrl.envs.adapters.openenv_mapping import (
    ACTION_TOOL,
    ActionMapping,
    BadObservation,
    InvalidAction,
    observation_messages,
    observation_tools,
)
from agentrl.envs.adapters.openenv_session import (
    HttpSession,
    WebSocketSession,
    fetch_json,
    offers_websocket,
)
from agentrl.envs.adapters.remote import RemoteEnvError
from agentrl.envs.agent_env import AgentEnv
from agentrl.envs.task import SPLITS
from agentrl.types import Message

NAMESPACE = "openenv"
_schemas: dict[str, dict[str, Any]] = {}
_http_only: set[str] = set()
_lock = threading.Lock()


class OpenEnvEnv(AgentEnv):
    """An OpenEnv server's environment, one session per instance (see the module doc)."""

    max_turns = 8

    def __init__(self, *, url: str | None = None, command: str | list[str] | None = None,
                 cwd: str | None = None, package: str | None = None, system_prompt: str = "",
                 action_field: str | None = None, action_map: str | None = None,
                 observation_field: str | None = None, observation_map: str | None = None,
                 reset_kwargs: dict[str, Any] | None = None,
                 eval_reset_kwargs: dict[str, Any] | None = None,
                 eval_seed_offset: int = 1_000_000, timeout_s: float = 20.0,
                 connect_timeout_s: float = 10.0, start_timeout_s: float = 120.0,
                 session_wait_s: float = 5.0,
                 transport: Literal["auto", "websocket", "http"] = "auto", **kwargs: Any):
        """Connect to (or start) the server and read its ``/schema``; see the module doc.

        ``cwd``: the folder ``command`` runs in (relative to where agentrl runs).
        ``system_prompt``: a system message put before every reset observation.
        ``action_field`` / ``action_map``, ``observation_field`` / ``observation_map``:
        overrides of the mapping ("module:function" or "file.py:function").
        ``reset_kwargs``: extra data of every reset. ``timeout_s``: seconds one answer may
        take; ``connect_timeout_s``: seconds to open a session; ``start_timeout_s``: seconds a
        local server may take to answer ``/health``; ``session_wait_s``: seconds to retry
        opening a session on a full server. ``transport``: "auto" (WebSocket, else HTTP).
        """
        super().__init__(**kwargs)
        require("openenv.core", "an OpenEnv environment")  # here: a missing extra fails early
        self.base_url = server_url(url, command, cwd, package, start_timeout_s)
        self.system_prompt = system_prompt
        self.reset_kwargs = dict(reset_kwargs or {})
        self.eval_reset_kwargs = dict(eval_reset_kwargs or {})
        self.eval_seed_offset = eval_seed_offset
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.session_wait_s = session_wait_s
        self.transport = transport
        self.observation_field = observation_field
        self.observation_map = _callable(observation_map, "observation_map")
        self.schema = action_schema(self.base_url, timeout_s)
        self.mapping = ActionMapping(self.schema, action_field,
                                     _callable(action_map, "action_map"), self.parser)
        self.served_tools: list[dict[str, Any]] = []
        self._session: Any = None

    # ------------------------------------------------------------------ gymnasium API

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools the server declared at reset, and the ``action`` tool of a structured
        action (mapping rule 3)."""
        return self.mapping.tool_schemas() + self.served_tools

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on this instance's session (opened on the first reset)."""
        gymnasium.Env.reset(self, seed=seed)
        split = (options or {}).get("split", "train")
        if split not in SPLITS:
            raise ValueError(f"options['split'] is {split!r}; use one of {SPLITS}")
        data = dict(self.reset_kwargs)
        offset = 0
        if split == "eval":
            data.update(self.eval_reset_kwargs)
            offset = 0 if self.eval_reset_kwargs else self.eval_seed_offset
        if seed is not None:
            data["seed"] = seed + offset
        reply = self._reset(data)
        try:
            shown = observation_messages(reply.observation, self.observation_field,
                                         self.observation_map, is_reset=True)
        except BadObservation as exc:
            raise RemoteEnvError("env_bad_reply", f"{self.base_url}: reset: {exc}") from None
        messages = ([Message("system", self.system_prompt)] if self.system_prompt else []) + shown
        if not messages:
            raise RemoteEnvError("env_bad_reply", f"{self.base_url}: the reset observation "
                                 "shows nothing; give system_prompt or observation_field")
        self.served_tools = observation_tools(reply.observation)
        self.history = list(messages)
        self._turn, self._done = 0, reply.done
        return [msgspec.structs.replace(m) for m in messages], {"split": split}

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Send the action the text maps to; answer unmappable text with an error message."""
        self.begin_step(action, started=self._session is not None)
        info: dict[str, Any] = {"tool_errors": {}, "reward_components": {},
                                "num_tool_calls": int(self.mapping.mode == "json")}
        try:
            mapped = self.mapping.action(action)
        except InvalidAction as exc:
            info["tool_errors"] = {exc.kind: 1}
            observation = self._as_replies([Message("user", f"Error ({exc.kind}): {exc}")])
            return self._end_step(observation, 0.0, False, info)
        reply = self._session.step(mapped)
        try:
            observation = self._as_replies(observation_messages(
                reply.observation, self.observation_field, self.observation_map))
        except BadObservation as exc:
            raise RemoteEnvError("env_bad_reply", f"{self.base_url}: step: {exc}") from None
        return self._end_step(observation, reply.reward, reply.done, info)

    def demonstrate(self, messages: list[Message]) -> str | None:
        """The server's scripted next action, when its session state offers one
        (``agentrl serve-env --expose-demonstrations``); else None."""
        if self._session is None or self._done:
            return None
        demonstration = self._session.state().get("demonstration")
        return demonstration if isinstance(demonstration, str) else None

    def close(self) -> None:
        """Close this instance's session (the server drops its environment)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    # ------------------------------------------------------------------ internals

    def _reset(self, data: dict[str, Any]) -> Any:
        if self._session is None:
            self._session = self._new_session()
        try:
            return self._session.reset(data)
        except RemoteEnvError as exc:
            if self.transport != "auto" or offers_websocket(exc):
                raise
        with _lock:
            if self.base_url not in _http_only:
                _http_only.add(self.base_url)
                warnings.warn(f"{self.base_url} offers no WebSocket session (/ws): using its "
                              "HTTP /reset and /step, where OpenEnv's servers build a fresh "
                              "environment per request", stacklevel=2)
        self._session = HttpSession(self.base_url, self.timeout_s)
        return self._session.reset(data)

    def _new_session(self) -> Any:
        if self.transport == "http" or self.base_url in _http_only:
            return HttpSession(self.base_url, self.timeout_s)
        return WebSocketSession(self.base_url, self.timeout_s, self.connect_timeout_s,
                                self.session_wait_s)

    def _as_replies(self, messages: list[Message]) -> list[Message]:
        """A structured action was a call of the ``action`` tool: answer as that tool."""
        if self.mapping.mode != "json":
            return messages
        return [Message("tool", m.content, ACTION_TOOL) if m.role == "user" else m
                for m in messages]

    def _end_step(self, observation: list[Message], reward: float, terminated: bool,
                  info: dict[str, Any]) -> tuple[list[Message], float, bool, bool, dict]:
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        self.history.extend(observation)
        return ([msgspec.structs.replace(m) for m in observation], float(reward), terminated,
                truncated, info)


def server_url(url: str | None, command: str | list[str] | None, cwd: str | None,
               package: str | None, start_timeout_s: float) -> str:
    """The base URL of the server: the given one, or that of a server started here."""
    from agentrl.envs.adapters.openenv_launch import local_server, package_command

    given = [name for name, value in (("url", url), ("command", command),
                                      ("package", package)) if value]
    if len(given) != 1:
        raise ValueError(f"an OpenEnv environment needs exactly one of url, command or "
                         f"package; got {', '.join(given) or 'none'}")
    if url:
        if not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"url {url!r} is not an http(s):// or ws(s):// address")
        return url.rstrip("/").replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    if package:
        return local_server(package_command(package), None, start_timeout_s)
    return local_server(command, cwd, start_timeout_s)  # type: ignore[arg-type]


def action_schema(base_url: str, timeout_s: float) -> dict[str, Any]:
    """The server's action schema (``GET /schema``), read once per server and process."""
    with _lock:
        known = _schemas.get(base_url)
    if known is not None:
        return known
    schema = fetch_json(f"{base_url}/schema", timeout_s)
    action = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action, dict):
        raise RemoteEnvError("env_bad_reply", f"{base_url}/schema has no action schema; is it "
                             "an OpenEnv server?")
    with _lock:
        _schemas[base_url] = action
    return action


def _callable(path: str | None, what: str) -> Callable | None:
    if path is None:
        return None
    from agentrl.envs.registry import load_object

    target = load_object(path, what)
    if not callable(target):
        raise ValueError(f"{what} = {path!r} is not a function")
    return target


def register(name: str) -> None:
    """Register ``openenv/NAME``: the installed OpenEnv environment package NAME."""
    gymnasium.register(f"{NAMESPACE}/{name}", entry_point=f"{__name__}:OpenEnvEnv",
                       kwargs={"package": name}, disable_env_checker=True, order_enforce=False)
