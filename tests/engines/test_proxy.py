"""The token-checking proxy `agentrl serve` puts in front of vLLM off loopback, tried with
the built-in server behind it (same routes): nothing reaches the server without the
token, and with it generation and a whole weight sync pass through unchanged."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from agentrl.engines.proxy import start_proxy
from agentrl.engines.remote import RemoteEngine
from tests.engines.attack_tools import TOKEN, post, raw_exchange
from tests.engines.test_remote import greedy_ids, weights_of


@pytest.fixture
def proxied(ckpt_a, serve):
    upstream = serve(ckpt_a)  # no token of its own, on loopback
    loop, ready, proxies = asyncio.new_event_loop(), threading.Event(), []

    def run():
        asyncio.set_event_loop(loop)
        proxies.append(loop.run_until_complete(start_proxy(upstream.url, "127.0.0.1", 0,
                                                           TOKEN)))
        ready.set()
        loop.run_forever()

    def stop():
        proxies[0].close()
        loop.stop()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10)
    yield upstream, proxies[0].sockets[0].getsockname()[1]
    loop.call_soon_threadsafe(stop)


def test_nothing_passes_the_proxy_without_the_token(proxied):
    upstream, port = proxied
    body = json.dumps({"init_info": {"master_address": "127.0.0.1", "master_port": 1,
                                     "rank_offset": 1, "world_size": 2}})
    for path, text in [("/init_weight_transfer_engine", body), ("/start_weight_update", "{}"),
                       ("/finish_weight_update", '{"weight_version": 666}'),
                       ("/v1/completions", '{"prompt": [1], "max_tokens": 2}')]:
        assert raw_exchange(port, post(path, text))[0] == 401
    assert upstream.server.num_requests == 0 and upstream.server.engine.weight_version == 0


def test_generation_and_a_weight_sync_pass_through_with_the_token(proxied, ckpt_a):
    upstream, port = proxied
    remote = RemoteEngine(f"http://127.0.0.1:{port}", token=TOKEN).connect()
    direct = RemoteEngine(upstream.url, token="").connect()
    assert greedy_ids(remote) == greedy_ids(direct)
    remote.update_weights(weights_of(ckpt_a), version=4)
    assert direct.served_version() == 4
