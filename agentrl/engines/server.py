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
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.engines.collective import GlooReceiver
from agentrl.engines.http import RequestHandler, json_handler, start_request_server
from agentrl.engines.protocol import completion_response, parse_completion_request

Route = Callable[[Any, dict[str, list[str]]], Awaitable[Any]]


class EngineServer:
    """Routes HTTP requests to one ``TorchEngine``."""

    def __init__(self, engine: Any, tokenizer: Any, model_name: str) -> None:
        """``model_name``: the id ``/v1/models`` reports."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.receiver = GlooReceiver()
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
        """Join the trainer's group (blocks a worker thread, not the server)."""
        init_info = (body or {}).get("init_info")
        if not isinstance(init_info, dict):
            raise ValueError("init_weight_transfer_engine needs {'init_info': {...}}")
        await asyncio.to_thread(self.receiver.connect, init_info)
        return {"message": "Weight transfer initialized"}

    async def start_update(self, body: Any, query: dict) -> Any:
        """Begin a sync session."""
        self.engine.start_weight_update()
        return {"message": "Weight update started"}

    async def update_weights(self, body: Any, query: dict) -> Any:
        """Receive one bucket over the group and load it."""
        info = (body or {}).get("update_info")
        if not isinstance(info, dict):
            raise ValueError("update_weights needs {'update_info': {names, dtype_names, "
                             "shapes}}")
        bucket = await asyncio.to_thread(self.receiver.receive, info)
        self.engine.load_bucket(bucket)
        return {"message": "Weights updated"}

    async def finish_update(self, body: Any, query: dict) -> Any:
        """End the session and serve the given version."""
        version = (body or {}).get("weight_version")
        if version is None or not str(version).lstrip("-").isdigit():
            raise ValueError(f"finish_weight_update needs an integer weight_version, got "
                             f"{version!r}")
        self.engine.finish_weight_update(int(version))
        return {"message": "Weight update finished"}

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
                        wrap: Callable[[RequestHandler], RequestHandler] | None = None) -> None:
    """Serve until cancelled; ``ready(port)`` is called once listening (port 0 picks one);
    ``wrap``: more routes on the same port (the chat endpoint)."""
    handler = json_handler(server.handle)
    http = await start_request_server(wrap(handler) if wrap else handler, host, port)
    bound = http.sockets[0].getsockname()[1]
    if ready is not None:
        ready(bound)
    async with http:
        await http.serve_forever()
