"""``agentrl serve``: the built-in engine as an HTTP replica that the trainer drives.

It answers the same routes a vLLM server does for RL (``VLLM_SERVER_DEV_MODE=1``), so one
client (``RemoteEngine``) drives both:

- ``POST /v1/completions``: token ids in, token ids + log-probs out
  (``agentrl.engines.protocol``); ``GET /v1/models``, ``GET /health``;
- ``POST /init_weight_transfer_engine``: join the trainer's gloo group (``init_info``);
- ``POST /start_weight_update``, ``/update_weights``, ``/finish_weight_update``: one sync,
  each bucket received over the group, then ``weight_version`` served;
- ``GET /weight_info``, ``GET /get_world_size``: the served version; workers (1);
- ``POST /sleep``, ``/wake_up``, ``GET /is_sleeping``: free the KV cache / take it back;
- ``GET /agentrl/info``: version and counters (requests, generated tokens).

A cancelled client request (closed socket) cancels its generation.

With a token (``agentrl.engines.auth``; required off loopback), every route but
``/health`` needs it. A weight push is staged: each bucket is checked against the served
model (names, shapes, dtypes) before a byte is received, held aside, and installed only
by a ``finish_weight_update`` that names a version once every parameter arrived; a
refused or partial push leaves the served weights and version untouched. One
``init_weight_transfer_engine`` runs at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import torch

from agentrl.engines.auth import TokenGate
from agentrl.engines.collective import GlooReceiver
from agentrl.engines.http import (
    DEFAULT_LIMITS,
    RequestHandler,
    ServerLimits,
    json_handler,
    start_request_server,
)
from agentrl.engines.protocol import completion_response, parse_completion_request
from agentrl.engines.request_checks import check_init_info, check_update_info

Route = Callable[[Any, dict[str, list[str]]], Awaitable[Any]]


class EngineServer:
    """Routes HTTP requests to one ``TorchEngine``."""

    def __init__(self, engine: Any, tokenizer: Any, model_name: str,
                 token: str | None = None) -> None:
        """``model_name``: the id ``/v1/models`` reports; ``token``: the shared token every
        route but ``/health`` needs (None: none needed, loopback only)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.gate = TokenGate(token, "agentrl serve")
        self.receiver = GlooReceiver()
        self._staged: dict[str, torch.Tensor] | None = None
        """The tensors of the push in progress, installed by its finish."""
        self._connecting = False
        self.num_requests = 0
        self.num_generated_tokens = 0
        self._ids = itertools.count()
        self.routes: dict[tuple[str, str], Route] = {
            ("POST", "/v1/completions"): self.completions,
            ("GET", "/v1/models"): self.models,
            ("GET", "/health"): self.health,
            ("GET", "/agentrl/info"): self.info,
            ("GET", "/weight_info"): self.weight_info,
            ("GET", "/get_world_size"): self.world_size,
            ("POST", "/init_weight_transfer_engine"): self.init_transfer,
            ("POST", "/start_weight_update"): self.start_update,
            ("POST", "/update_weights"): self.update_weights,
            ("POST", "/finish_weight_update"): self.finish_update,
            ("POST", "/sleep"): self.sleep,
            ("POST", "/wake_up"): self.wake_up,
            ("GET", "/is_sleeping"): self.is_sleeping,
        }

    async def handle(self, method: str, target: str, body: Any,
                     disconnected: Callable[[], Awaitable[None]]) -> tuple[int, Any]:
        """Answer one request: (HTTP status, JSON answer)."""
        url = urllib.parse.urlsplit(target)
        route = self.routes.get((method, url.path))
        if route is None:
            return 404, {"error": f"no route {method} {url.path}"}
        query = urllib.parse.parse_qs(url.query)
        work = asyncio.ensure_future(route(body, query))
        gone = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client went away: drop its generation
                work.cancel()
                return 499, {"error": "client closed the request"}
            return 200, work.result()
        except ValueError as exc:
            return 400, {"error": str(exc)}
        except RuntimeError as exc:  # e.g. a sync while generations are in flight
            return 409, {"error": str(exc)}
        except Exception as exc:
            return 500, {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            gone.cancel()

    async def completions(self, body: Any, query: dict) -> Any:
        """One completion, token ids in and out."""
        prompt_ids, params = parse_completion_request(body, self.tokenizer.eos_token_id)
        key = body.get("session_id")
        generation = await self.engine.generate(prompt_ids, params, key=key)
        self.num_requests += 1
        self.num_generated_tokens += len(generation.token_ids)
        return completion_response(generation, self.model_name, len(prompt_ids),
                                   f"cmpl-agentrl-{next(self._ids)}")

    async def models(self, body: Any, query: dict) -> Any:
        """The served model (OpenAI's list format)."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                            "owned_by": "agentrl"}]}

    async def health(self, body: Any, query: dict) -> Any:
        """Liveness."""
        return {"status": "ok"}

    async def info(self, body: Any, query: dict) -> Any:
        """The served version and the counters (tests, benchmarks)."""
        return {"server": "agentrl", "weight_version": self.engine.weight_version,
                "num_requests": self.num_requests,
                "num_generated_tokens": self.num_generated_tokens,
                "transports": ["gloo"]}

    async def weight_info(self, body: Any, query: dict) -> Any:
        """vLLM's answer shape: the version as a string."""
        return {"weight_version": str(self.engine.weight_version)}

    async def world_size(self, body: Any, query: dict) -> Any:
        """One worker: the server process itself."""
        return {"world_size": 1}

    async def init_transfer(self, body: Any, query: dict) -> Any:
        """Join the trainer's group (blocks a worker thread, not the server); one at a
        time."""
        init_info = check_init_info((body or {}).get("init_info")
                                    if isinstance(body, dict) else None)
        if self._connecting:
            raise RuntimeError("another init_weight_transfer_engine is in progress; one "
                               "trainer syncs a replica at a time")
        self._connecting = True
        try:
            await asyncio.to_thread(self.receiver.connect, init_info)
        finally:
            self._connecting = False
        return {"message": "Weight transfer initialized"}

    async def start_update(self, body: Any, query: dict) -> Any:
        """Begin a sync session (409 while generations run on a full-weight engine)."""
        self.engine.start_weight_update()
        self._staged = {}
        return {"message": "Weight update started"}

    async def update_weights(self, body: Any, query: dict) -> Any:
        """Receive one bucket over the group, checked against the served model first, and
        stage it."""
        if self._staged is None:
            raise RuntimeError("update_weights outside a weight update: call "
                               "start_weight_update first")
        info = (body or {}).get("update_info") if isinstance(body, dict) else None
        check_update_info(info, self._expected_shapes())
        bucket = await asyncio.to_thread(self.receiver.receive, info)
        if self._staged is None:  # a finish came meanwhile
            raise RuntimeError("the weight update ended while this bucket was received")
        self._staged.update(bucket)
        return {"message": "Weights updated"}

    async def finish_update(self, body: Any, query: dict) -> Any:
        """End the session: install the staged tensors and serve the given version, only
        when every one arrived; otherwise drop them (served weights untouched)."""
        staged, self._staged = self._staged, None
        version = (body or {}).get("weight_version") if isinstance(body, dict) else None
        if version is None or not str(version).lstrip("-").isdigit():
            raise ValueError(f"finish_weight_update needs an integer weight_version, got "
                             f"{version!r}; the staged tensors are dropped")
        if staged is None:
            raise RuntimeError("finish_weight_update without start_weight_update")
        missing = sorted(self._required_names() - staged.keys())
        if missing:
            raise ValueError(f"the weight update lacks {len(missing)} tensors, e.g. "
                             f"{missing[:3]}; nothing was installed, the served version "
                             f"stays {self.engine.weight_version}")
        self.engine.start_weight_update()
        self.engine.load_bucket(list(staged.items()))
        self.engine.finish_weight_update(int(version))
        return {"message": "Weight update finished"}

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name → shape of every tensor a push may carry (a LoRA engine: its adapters)."""
        adapters = getattr(self.engine, "adapters", None)
        if adapters is not None:
            return dict(adapters.shapes)
        return {n: tuple(t.shape) for n, t in self.engine.model.state_dict().items()}

    def _required_names(self) -> set[str]:
        """The tensors a complete push carries."""
        adapters = getattr(self.engine, "adapters", None)
        if adapters is not None:
            return set(adapters.shapes)
        return {n for n, _ in self.engine.model.named_parameters()}

    async def sleep(self, body: Any, query: dict) -> Any:
        """Free the KV cache."""
        level = int(query.get("level", ["1"])[0])
        self.engine.sleep(level)
        return {"status": "sleeping", "level": level}

    async def wake_up(self, body: Any, query: dict) -> Any:
        """The KV cache comes back with the next request."""
        self.engine.wake_up(query.get("tags"))
        return {"status": "awake", "tags": query.get("tags")}

    async def is_sleeping(self, body: Any, query: dict) -> Any:
        """Whether the KV cache is freed."""
        return {"is_sleeping": self.engine.is_sleeping}


async def serve_forever(server: EngineServer, host: str, port: int,
                        ready: Callable[[int], None] | None = None,
                        wrap: Callable[[RequestHandler], RequestHandler] | None = None,
                        limits: ServerLimits = DEFAULT_LIMITS) -> None:
    """Serve until cancelled; ``ready(port)`` is called once listening (port 0 picks one);
    ``wrap``: more routes on the same port (the chat endpoint), behind the same token."""
    handler = json_handler(server.handle)
    http = await start_request_server(wrap(handler) if wrap else handler, host, port,
                                      limits=limits, gate=server.gate)
    bound = http.sockets[0].getsockname()[1]
    if ready is not None:
        ready(bound)
    async with http:
        await http.serve_forever()
