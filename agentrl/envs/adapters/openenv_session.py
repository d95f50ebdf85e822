"""One session on an OpenEnv server, and every way it can fail, named.

:class:`WebSocketSession` drives the server's ``/ws`` endpoint through OpenEnv's own client
(``GenericEnvClient``, synchronous wrapper): the server keeps one environment instance per
connection until the connection closes. A server that does not offer ``/ws`` is driven
over HTTP instead (:class:`HttpSession`: ``POST /reset`` and ``POST /step``); OpenEnv's own
HTTP endpoints build a fresh environment for every request, so over HTTP only servers that
keep state themselves (or single-step environments) play multi-turn episodes correctly.

Every failure becomes a :class:`~agentrl.envs.adapters.remote.RemoteEnvError` whose kind
names it: the server cannot be reached, it is full, the connection dropped, it answered
with an error, it did not answer in time, or its answer is malformed.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from typing import Any, NamedTuple

from agentrl.config.extras import require
from agentrl.config.token import load_token, token_headers
from agentrl.envs.adapters.remote import RemoteEnvError
from agentrl.text import brief, exception_message

CAPACITY_RETRY_S = 0.25
"""Pause between two tries to open a session on a full server."""


class Reply(NamedTuple):
    """A checked answer to reset or step."""

    observation: dict[str, Any]
    reward: float
    done: bool


def check_reply(url: str, what: str, observation: Any, reward: Any, done: Any) -> Reply:
    """An observation object, a finite reward (or none: 0.0) and a bool; else env_bad_reply."""
    if not isinstance(observation, dict):
        raise RemoteEnvError("env_bad_reply", f"{url}: {what} answered observation "
                             f"{brief(repr(observation), 120)}; expected a JSON object")
    if reward is None:
        reward = 0.0
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(
            reward):
        raise RemoteEnvError("env_bad_reply", f"{url}: {what} answered reward "
                             f"{brief(repr(reward), 80)}; expected a finite number or null")
    if not isinstance(done, bool):
        raise RemoteEnvError("env_bad_reply", f"{url}: {what} answered done "
                             f"{brief(repr(done), 80)}; expected true or false")
    return Reply(observation, float(reward), done)


class WebSocketSession:
    """One ``/ws`` session through OpenEnv's ``GenericEnvClient``; opened on first use."""

    def __init__(self, url: str, timeout_s: float, connect_timeout_s: float,
                 session_wait_s: float) -> None:
        """``timeout_s``: seconds one answer may take; ``session_wait_s``: how long to keep
        retrying when the server is full (its other sessions may be closing)."""
        self.url = url
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.session_wait_s = session_wait_s
        self._client: Any = None

    def reset(self, data: dict[str, Any]) -> Reply:
        """Start an episode (opens the session first)."""
        deadline = time.monotonic() + self.session_wait_s
        while True:
            try:
                result = self._call(lambda client: client.reset(**data), "reset")
                break
            except RemoteEnvError as exc:
                if exc.kind != "env_server_full" or time.monotonic() > deadline:
                    raise
                self.close()  # a refused session is closed by the server: open another
                time.sleep(CAPACITY_RETRY_S)
        return check_reply(self.url, "reset", result.observation, result.reward, result.done)

    def step(self, action: dict[str, Any]) -> Reply:
        """One action."""
        result = self._call(lambda client: client.step(action), "step")
        return check_reply(self.url, "step", result.observation, result.reward, result.done)

    def state(self) -> dict[str, Any]:
        """The session's state (OpenEnv's ``state`` message)."""
        state = self._call(lambda client: client.state(), "state")
        if not isinstance(state, dict):
            raise RemoteEnvError("env_bad_reply", f"{self.url}: state answered "
                                 f"{brief(repr(state), 120)}; expected a JSON object")
        return state

    def close(self) -> None:
        """Close the session (the server drops its environment instance); idempotent."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail too
                pass

    def _call(self, fn: Any, what: str) -> Any:
        if self._client is None:
            core = require("openenv.core", "an OpenEnv environment")
            self._client = core.GenericEnvClient(
                base_url=self.url, connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.timeout_s,
                headers=token_headers(load_token()) or None).sync()  # serve-env's token
        try:
            return fn(self._client)
        except Exception as exc:  # noqa: BLE001 - classified, never raised as it is
            error = classify(self.url, what, exc, self.timeout_s)
        if error.kind != "env_server_error":
            self.close()  # the connection is gone or out of step: a later call reopens
        raise error


def classify(url: str, what: str, exc: BaseException, timeout_s: float) -> RemoteEnvError:
    """The named failure behind an exception of OpenEnv's client."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    text = brief(exception_message(exc), 400)
    if isinstance(exc, RemoteEnvError):
        return exc
    if isinstance(exc, TimeoutError):
        return RemoteEnvError("env_server_timeout", f"{url}: {what} got no answer within "
                              f"{timeout_s:g} s (timeout_s)")
    if isinstance(exc, ConnectionClosed):
        return RemoteEnvError("env_disconnected", f"{url}: the connection closed during "
                              f"{what} ({text})")
    if isinstance(exc, ConnectionError):
        if isinstance(exc.__cause__, InvalidStatus):
            return RemoteEnvError("env_unreachable", f"{url}: the server refused a WebSocket "
                                  f"session ({text})")
        return RemoteEnvError("env_unreachable", f"{url}: cannot connect ({text}); is the "
                              "server running?")
    if isinstance(exc, RuntimeError) and text.startswith("Server error"):
        if "CAPACITY_REACHED" in text:
            return RemoteEnvError("env_server_full", f"{url}: {text}; agentrl opens one "
                                  "session per concurrent rollout: raise the server's "
                                  "max_concurrent_envs or lower rollout.max_concurrent_rollouts")
        return RemoteEnvError("env_server_error", f"{url}: {what} failed on the server: {text}")
    if isinstance(exc, ValueError | TypeError | AttributeError | KeyError):
        return RemoteEnvError("env_bad_reply", f"{url}: {what} answered something that is "
                              f"not OpenEnv's protocol ({type(exc).__name__}: {text})")
    return RemoteEnvError("env_server_error", f"{url}: {what} failed: {type(exc).__name__}: "
                          f"{text}")


def offers_websocket(exc: RemoteEnvError) -> bool:
    """Whether a failed first reset still means the server has a ``/ws`` endpoint."""
    return not (exc.kind == "env_unreachable" and "refused a WebSocket" in str(exc))


class HttpSession:
    """``POST /reset`` and ``POST /step`` of a server without ``/ws`` (see module doc)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        """``url``: the server's base URL."""
        self.url = url
        self.timeout_s = timeout_s

    def reset(self, data: dict[str, Any]) -> Reply:
        """``POST /reset`` with the reset data."""
        return self._post("reset", data)

    def step(self, action: dict[str, Any]) -> Reply:
        """``POST /step`` with ``{"action": action}``."""
        return self._post("step", {"action": action})

    def state(self) -> dict[str, Any]:
        """``GET /state``."""
        return self._request("state", None)

    def close(self) -> None:
        """Nothing to close: HTTP keeps no session."""

    def _post(self, what: str, body: dict[str, Any]) -> Reply:
        reply = self._request(what, body)
        return check_reply(self.url, what, reply.get("observation"), reply.get("reward"),
                           reply.get("done", False))

    def _request(self, what: str, body: dict[str, Any] | None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}/{what}", data=data,
                                         headers={"Content-Type": "application/json",
                                                  **token_headers(load_token())})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = brief(exc.read().decode(errors="replace"), 300)
            raise RemoteEnvError("env_server_error", f"{self.url}/{what}: HTTP {exc.code} "
                                 f"({detail})") from None
        except TimeoutError:
            raise RemoteEnvError("env_server_timeout", f"{self.url}/{what}: no answer within "
                                 f"{self.timeout_s:g} s (timeout_s)") from None
        except (urllib.error.URLError, OSError) as exc:
            if isinstance(getattr(exc, "reason", None), TimeoutError):
                raise RemoteEnvError("env_server_timeout", f"{self.url}/{what}: no answer "
                                     f"within {self.timeout_s:g} s (timeout_s)") from None
            raise RemoteEnvError("env_unreachable", f"{self.url}/{what}: cannot connect "
                                 f"({exc})") from None
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise RemoteEnvError("env_bad_reply", f"{self.url}/{what}: the answer is not a "
                                 f"JSON object: {brief(raw.decode(errors='replace'), 120)!r}")
        return reply


def fetch_json(url: str, timeout_s: float) -> Any:
    """``GET url`` as JSON; RemoteEnvError (named) when it fails."""
    request = urllib.request.Request(url, headers=token_headers(load_token()))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RemoteEnvError("env_server_error", f"{url}: HTTP {exc.code}") from None
    except TimeoutError:
        raise RemoteEnvError("env_server_timeout", f"{url}: no answer within {timeout_s:g} s"
                             ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise RemoteEnvError("env_unreachable", f"{url}: cannot connect ({exc}); is the "
                             "server running?") from None
    except ValueError:
        raise RemoteEnvError("env_bad_reply", f"{url}: the answer is not JSON") from None
