"""A built-in engine behind ``agentrl serve``'s HTTP routes, driven by ``RemoteEngine``:
the same tokens and log-probs as in process, clear errors, weight sync over gloo with a
version, failures and timeouts that raise naming the replica."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import torch

from agentrl.engines.http import HTTPError, ReplicaUnavailableError, request_json
from agentrl.engines.interface import SamplingParams, WeightSyncError
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.router import EngineRouter
from agentrl.engines.server import EngineServer
from agentrl.model import load_pretrained, load_tokenizer
from tests.engines.servers import engine_on

PROMPTS = [[5, 17, 200, 33], [40, 2, 9], [120, 121, 122, 123, 124, 125, 7], [99]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def generate_all(engine, prompts, params, keys=None):
    async def main():
        return await asyncio.gather(*(engine.generate(p, params, key=k)
                                      for p, k in zip(prompts, keys or [None] * len(prompts),
                                                      strict=True)))
    return asyncio.run(main())


def greedy_ids(engine, prompts=PROMPTS):
    return [g.token_ids for g in generate_all(engine, prompts, GREEDY)]


def weights_of(path):
    """The (name, tensor) pairs a trainer would send: named_parameters, one at a time."""
    model = load_pretrained(path, attention="torch")
    return ((n, p.detach()) for n, p in model.named_parameters())


def test_remote_generation_equals_the_engine_in_process(ckpt_a, serve):
    server = serve(ckpt_a)
    remote = RemoteEngine(server.url).connect()
    local = engine_on(ckpt_a)
    assert remote.is_agentrl and remote.model == "tiny" and remote.weight_version == 0
    assert greedy_ids(remote) == greedy_ids(local)
    sampled = SamplingParams(temperature=1.0, max_tokens=6, seed=11, stop_token_ids=(3,))
    got = generate_all(remote, PROMPTS, sampled, keys=["r1", "r2", "r3", "r4"])
    want = generate_all(local, PROMPTS, sampled)
    assert [(g.token_ids, g.finish_reason) for g in got] == [
        (w.token_ids, w.finish_reason) for w in want]
    for g, w in zip(got, want, strict=True):  # batch composition moves the last float bits
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
    assert server.server.num_requests == 8


def test_requests_the_subset_does_not_serve_are_refused(ckpt_a, serve):
    server = serve(ckpt_a)
    with pytest.raises(HTTPError, match="400.*token ids only, never text"):
        asyncio.run(request_json(server.url, "/v1/completions", {"prompt": "hello"}, 5))
    with pytest.raises(HTTPError, match="400.*n = 2 is not served"):
        asyncio.run(request_json(server.url, "/v1/completions", {"prompt": [1], "n": 2}, 5))
    with pytest.raises(HTTPError, match="404"):
        asyncio.run(request_json(server.url, "/v2/nothing", None, 5))
    too_long = list(range(5, 140))  # the engine holds 128 tokens per request
    with pytest.raises(ValueError, match="answered 400.*max_len 128"):  # invalidates a rollout
        generate_all(RemoteEngine(server.url).connect(), [too_long], GREEDY)


def test_an_unreachable_server_raises_naming_its_url_without_hanging():
    with socket.socket() as sock:  # a port that nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(ReplicaUnavailableError, match=f"{dead}/v1/models unreachable"):
        RemoteEngine(dead).connect()
    with pytest.raises(ReplicaUnavailableError, match=f"{dead}/v1/completions unreachable"):
        generate_all(RemoteEngine(dead), [[1, 2]], GREEDY)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        begin = time.monotonic()
        with pytest.raises(ReplicaUnavailableError, match=f"{url}/v1/completions did not "
                                                          "answer within 1 s"):
            generate_all(RemoteEngine(url, request_timeout_s=1.0), [[1, 2]], GREEDY)
        assert time.monotonic() - begin < 5.0


def test_a_server_error_takes_the_replica_out_instead_of_failing_the_collection():
    import http.server
    import threading

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the handler's API
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"internal error")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        router = EngineRouter([RemoteEngine(url, request_timeout_s=5.0)])
        with pytest.raises(ReplicaUnavailableError, match=f"{url} failed a generation"):
            generate_all(router, [[1, 2]], GREEDY)  # what invalidates only that rollout
        assert list(router.down) == [0]  # out of service, named
    finally:
        server.shutdown()


def test_a_sync_makes_every_server_serve_the_new_weights(ckpt_a, ckpt_b, serve):
    servers = [serve(ckpt_a), serve(ckpt_a)]
    router = EngineRouter([RemoteEngine(s.url).connect() for s in servers])
    before = greedy_ids(router)
    want_b = greedy_ids(engine_on(ckpt_b))
    assert before != want_b  # else this test could not fail
    router.update_weights(weights_of(ckpt_b))
    for server in servers:
        remote = RemoteEngine(server.url).connect()
        assert remote.served_version() == 1 and remote.weight_version == 1
        assert greedy_ids(remote) == want_b
    assert router.weight_version == 1
    router.update_weights(weights_of(ckpt_a), version=5)  # the group is reused
    assert [greedy_ids(RemoteEngine(s.url).connect()) for s in servers] == [before, before]
    assert [RemoteEngine(s.url).connect().served_version() for s in servers] == [5, 5]


def test_a_failed_sync_raises_naming_the_server_and_the_next_one_works(ckpt_a, ckpt_b, serve):
    server = serve(ckpt_a)
    remote = RemoteEngine(server.url).connect()
    bad = [("model.layers.0.mlp.up_proj.weight", torch.zeros(3, 3))]
    with pytest.raises(WeightSyncError, match=f"weight sync to {server.url} failed in load.*"
                                              r"up_proj.weight has shape \[3, 3\]"):
        remote.update_weights(bad)
    assert remote.served_version() == 0
    incomplete = [p for p in weights_of(ckpt_b) if p[0] != "model.norm.weight"]
    with pytest.raises(WeightSyncError, match="failed in finish.*lacks 1 tensors"):
        remote.update_weights(incomplete)
    remote.update_weights(weights_of(ckpt_b))
    assert remote.served_version() == 1
    assert greedy_ids(remote) == greedy_ids(engine_on(ckpt_b))


class NeverJoins(EngineServer):
    """Accepts the weight-transfer init but never joins the trainer's group."""

    async def init_transfer(self, body, query):
        await asyncio.sleep(3600)


def test_a_sync_that_times_out_raises_instead_of_hanging(ckpt_a, serve):
    server = serve(NeverJoins(engine_on(ckpt_a), load_tokenizer(ckpt_a), "tiny"))
    remote = RemoteEngine(server.url, sync_timeout_s=1.5).connect()
    begin = time.monotonic()
    # whichever notices first (all after 1.5 s): our wait for the server's call, that
    # call's HTTP timeout, or gloo's own rendezvous timeout
    with pytest.raises(WeightSyncError, match=f"weight sync to {server.url} failed in start: "
                                              ".*(did not (finish|answer) within 1.5 s|"
                                              "[Tt]imeout|timed out)"):
        remote.update_weights(weights_of(ckpt_a))
    assert time.monotonic() - begin < 8.0


def test_sleep_frees_the_kv_cache_and_generation_wakes_it(ckpt_a, serve):
    server = serve(ckpt_a)
    remote = RemoteEngine(server.url).connect()
    before = greedy_ids(remote)
    assert server.server.engine._cache is not None
    remote.sleep(1)
    assert server.server.engine.is_sleeping
    remote.wake_up()
    assert greedy_ids(remote) == before and not server.server.engine.is_sleeping
