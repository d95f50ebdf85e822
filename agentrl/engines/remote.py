"""A replica on another process or machine: ``agentrl serve`` or ``vllm serve``, one client.

Generation is token-in/token-out over ``/v1/completions`` (``agentrl.engines.protocol``);
weight sync uses vLLM's weight-transfer routes with a process group as data plane
(``agentrl.engines.sync_client``); sleep/wake are vLLM's ``/sleep`` and ``/wake_up``.
Every call has a timeout. A server that cannot be reached or does not answer in time raises
:class:`ReplicaUnavailableError` naming its URL; a request it refuses (4xx) raises
``ValueError``, which invalidates only that rollout.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.engines.auth import load_token
from agentrl.engines.http import (
    HTTPError,
    ReplicaUnavailableError,
    post_json_blocking,
    request_json,
    split_url,
)
from agentrl.engines.interface import Generation, NamedTensors, SamplingParams, next_version
from agentrl.engines.protocol import completion_request, generation_from_response
from agentrl.engines.sync_client import CollectiveSync, HttpControl, local_address_towards


class RemoteEngine:
    """An ``InferenceEngine`` (and ``WeightReceiver``) for one server."""

    def __init__(self, url: str, request_timeout_s: float = 600.0,
                 sync_timeout_s: float = 300.0, transport: str = "auto",
                 advertise_host: str = "", token: str | None = None) -> None:
        """``transport``: the weight-sync data plane ("gloo", "nccl"; "auto": gloo for
        ``agentrl serve``, NCCL for vLLM when this process has a GPU); ``advertise_host``:
        the trainer's address as the server reaches it ("" finds it from the route);
        ``token``: the run's shared token sent with every call (None: ``$AGENTRL_TOKEN``
        or ``$AGENTRL_TOKEN_FILE`` when set, ``agentrl.engines.auth``)."""
        split_url(url)  # a malformed URL fails here, naming it
        self.url = url.rstrip("/")
        self.name = self.url
        self.request_timeout_s = request_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.transport = transport
        self.advertise_host = advertise_host
        self.token = token if token is not None else load_token()
        self.weight_version = 0
        self.model: str | None = None
        self.is_agentrl = False
        self._sync: CollectiveSync | None = None

    def connect(self) -> RemoteEngine:
        """Check the server answers and learn what it serves; raises naming the URL."""
        models = self._get("/v1/models", timeout_s=min(30.0, self.request_timeout_s))
        self.model = models["data"][0]["id"] if models.get("data") else None
        try:
            info = self._get("/agentrl/info")
            self.is_agentrl = True
            self.weight_version = int(info["weight_version"])
        except HTTPError:  # a vLLM server
            self.weight_version = self.served_version()
        return self

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        """Complete one prompt on the server."""
        body = completion_request(prompt_ids, params, self.model, key)
        try:
            answer = await request_json(self.url, "/v1/completions", body,
                                        self.request_timeout_s, self.token)
        except HTTPError as exc:
            if 400 <= exc.status < 500:  # the server refused this request: only it fails
                raise ValueError(str(exc)) from exc
            # the server failed (5xx): it leaves service, the rollout is invalid, the
            # collection goes on with the other replicas
            raise ReplicaUnavailableError(f"{self.url} failed a generation: {exc}") from exc
        return generation_from_response(answer, self.url)

    def served_version(self) -> int:
        """The weight version the server reports (vLLM's ``/weight_info``; vLLM's
        "default" before any sync counts as 0)."""
        version = str(self._get("/weight_info")["weight_version"])
        return int(version) if version.lstrip("-").isdigit() else 0

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None) -> None:
        """Push new weights to this server alone (a router pushes to all at once)."""
        from agentrl.engines.weight_sync import push_weights

        push_weights([self], named_tensors, next_version(self.weight_version, version))

    def start_weight_update(self) -> None:
        """Begin a sync session (joining the trainer's group on the first one)."""
        self._collective().start_weight_update()

    def load_bucket(self, bucket: Any) -> None:
        """Send one bucket."""
        self._collective().load_bucket(bucket)

    def finish_weight_update(self, version: int) -> None:
        """End the session; the server now serves ``version``."""
        self._collective().finish_weight_update(version)
        self.weight_version = version

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode on the server (``agentrl serve``: frees its KV cache)."""
        self._post(f"/sleep?level={int(level)}")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake the server (only the given parts: "weights", "kv_cache")."""
        query = "&".join(f"tags={t}" for t in tags or [])
        self._post("/wake_up" + (f"?{query}" if query else ""))

    def close(self) -> None:
        """Drop the weight-sync group (the server stays up)."""
        if self._sync is not None:
            self._sync.close()

    def _collective(self) -> CollectiveSync:
        if self._sync is None:
            control = HttpControl(self.url, self.sync_timeout_s, self.token)
            transport = self.transport
            if transport == "auto":  # vLLM on GPUs: NCCL (a CPU-only trainer cannot)
                gpu = torch.cuda.is_available() and not self.is_agentrl
                transport = "nccl" if gpu else "gloo"
            if self.is_agentrl and transport != "gloo":
                raise ValueError(f"{self.url} is `agentrl serve`, which receives weights "
                                 f'over gloo only; set rollout.weight_transport = "auto"')
            host = self.advertise_host or local_address_towards(self.url)
            self._sync = CollectiveSync(self.name, control, transport, host,
                                        control.world_size(), self.sync_timeout_s)
        return self._sync

    def _get(self, path: str, timeout_s: float | None = None) -> Any:
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        return post_json_blocking(self.url, path, None, timeout_s, method="GET",
                                  token=self.token)

    def _post(self, path: str) -> Any:
        return post_json_blocking(self.url, path, None, self.sync_timeout_s,
                                  token=self.token)


__all__ = ["RemoteEngine", "ReplicaUnavailableError"]
