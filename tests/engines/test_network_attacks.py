"""`agentrl serve` attacked from the same machine (every target on 127.0.0.1, every loop
bounded): weight injection, partial pushes, the poison packet, malformed numbers, huge
heads and bodies, slow clients, too many connections. Each attack is refused or contained
and nothing else changes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import torch

from agentrl.engines.http import HTTPError, ServerLimits, request_json
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.server import EngineServer
from agentrl.model import load_tokenizer
from tests.engines.attack_tools import TOKEN, LimitedServer, post, raw_exchange, read_answer
from tests.engines.servers import engine_on
from tests.engines.test_remote import greedy_ids, weights_of

PUSH = [("/init_weight_transfer_engine", {"init_info": {
            "master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
            "world_size": 2, "timeout_s": 2}}),
        ("/start_weight_update", None),
        ("/update_weights", {"update_info": {"names": ["model.norm.weight"],
                                             "dtype_names": ["float32"], "shapes": [[32]]}}),
        ("/finish_weight_update", {"weight_version": 666})]


def guarded(ckpt, serve, token=TOKEN):
    return serve(EngineServer(engine_on(ckpt, "served"), load_tokenizer(ckpt), "tiny",
                              token=token))


def test_an_unauthenticated_weight_push_is_refused_and_changes_nothing(ckpt_a, serve):
    server = guarded(ckpt_a, serve)
    trainer = RemoteEngine(server.url, token=TOKEN).connect()
    before = greedy_ids(trainer)
    with socket.create_server(("127.0.0.1", 0)) as bait:  # where the attacker points it
        bait.setblocking(False)
        port = bait.getsockname()[1]
        for path, body in PUSH:
            if body and "init_info" in body:
                body["init_info"]["master_port"] = port
            for headers in ({}, {"X-Agentrl-Token": "wrong-token-wrong-token"},
                            {"Authorization": "Bearer " + TOKEN[:-1]}):
                status, answer = raw_exchange(server.port, post(path, json.dumps(body or {}),
                                                                 headers))
                assert status == 401, (path, answer)
                assert answer["error"]["type"] == "authentication_error"
        with pytest.raises(BlockingIOError):  # the server never connected out
            bait.accept()
    assert trainer.served_version() == 0
    assert greedy_ids(trainer) == before
    assert server.server.gate.num_refused == 12
    # the token's holder syncs as before
    trainer.update_weights(weights_of(ckpt_a), version=3)
    assert trainer.served_version() == 3


def test_every_route_but_health_needs_the_token(ckpt_a, serve):
    server = guarded(ckpt_a, serve)
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    assert raw_exchange(server.port, health)[0] == 200
    for route in ("/v1/models", "/agentrl/info", "/weight_info", "/is_sleeping"):
        request = f"GET {route} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        assert raw_exchange(server.port, request)[0] == 401
    for route in ("/v1/completions", "/v1/chat/completions", "/sleep"):
        assert raw_exchange(server.port, post(route, '{"prompt": [1]}'))[0] == 401


def test_a_partial_push_leaves_the_served_weights_and_version_untouched(ckpt_a, serve):
    server = serve(ckpt_a)
    trainer = RemoteEngine(server.url).connect()
    before = greedy_ids(trainer)
    trainer.start_weight_update()
    trainer.load_bucket([(name, torch.zeros_like(tensor))  # every tensor but the last
                         for name, tensor in list(weights_of(ckpt_a))[:-1]])
    with pytest.raises(HTTPError, match="lacks 1 tensors.*nothing was installed"):
        trainer.finish_weight_update(666)
    assert trainer.served_version() == 0
    assert greedy_ids(trainer) == before
    trainer.close()
    trainer.update_weights(weights_of(ckpt_a), version=1)  # a complete push still works
    assert trainer.served_version() == 1 and greedy_ids(trainer) == before


def test_a_push_naming_tensors_the_model_lacks_is_refused_before_receiving(ckpt_a, serve):
    server = serve(ckpt_a)
    for info in ({"names": ["x"], "dtype_names": ["float32"], "shapes": [[10**12]]},
                 {"names": ["model.norm.weight"], "dtype_names": ["float32"],
                  "shapes": [[10**12]]},
                 {"names": ["model.norm.weight"], "dtype_names": ["save"], "shapes": [[32]]}):
        raw_exchange(server.port, post("/start_weight_update", "{}"))
        status, answer = raw_exchange(server.port, post("/update_weights",
                                                        json.dumps({"update_info": info})))
        assert status == 400, answer


def test_a_second_concurrent_transfer_init_is_refused(ckpt_a, serve):
    server = serve(ckpt_a)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        body = json.dumps({"init_info": {"master_address": "127.0.0.1", "master_port": port,
                                         "rank_offset": 1, "world_size": 2, "timeout_s": 3}})
        first = threading.Thread(target=raw_exchange, daemon=True, args=(
            server.port, post("/init_weight_transfer_engine", body), 60))
        first.start()
        for _ in range(500):  # until the first one is connecting (bounded)
            if server.server._connecting:
                break
            time.sleep(0.01)
        status, answer = raw_exchange(server.port, post("/init_weight_transfer_engine", body))
    assert status == 409 and "in progress" in answer["error"]


def test_the_poison_packet_fails_alone_and_gets_its_answer(ckpt_a, serve):
    server = serve(ckpt_a)
    body = {"prompt": [5, 17, 200, 33], "max_tokens": 6, "temperature": 0.0,
            "ignore_eos": True}

    async def attack():
        good = [request_json(server.url, "/v1/completions", body, 60) for _ in range(4)]
        bad = request_json(server.url, "/v1/completions", {**body, "prompt": [10**9]}, 60)
        return await asyncio.gather(*good, bad, return_exceptions=True)

    *answers, refused = asyncio.run(attack())
    assert all(len(a["choices"][0]["token_ids"]) == 6 for a in answers), answers
    assert isinstance(refused, HTTPError) and refused.status == 400
    assert "outside the vocabulary" in str(refused)


def test_an_engine_failure_in_admission_answers_every_admitted_request(ckpt_a, monkeypatch):
    engine = engine_on(ckpt_a)
    import agentrl.engines.torch_engine as torch_engine

    def broken(*args, **kwargs):
        raise RuntimeError("prefill broke")

    monkeypatch.setattr(torch_engine, "prefill", broken)
    from agentrl.engines.interface import SamplingParams

    async def run():
        calls = [engine.generate([1, 2, 3], SamplingParams(max_tokens=4)) for _ in range(3)]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)

    assert [str(e) for e in asyncio.run(run())] == ["prefill broke"] * 3


@pytest.mark.parametrize("field", [
    '"max_tokens": NaN', '"max_tokens": Infinity', '"max_tokens": -Infinity',
    '"seed": 1e400', '"temperature": NaN', '"top_p": 2', '"max_tokens": 0',
    '"stop": [""]', '"stop_token_ids": [-1]', '"prompt": [1, true]', '"prompt": [-5]'])
def test_malformed_numbers_get_a_400_not_a_dropped_connection(ckpt_a, serve, field):
    server = serve(ckpt_a)
    text = '{"prompt": [1, 2], "max_tokens": 2, ' + field + "}"
    status, answer = raw_exchange(server.port, post("/v1/completions", text))
    assert status == 400 and answer["error"], answer


def test_deep_json_gets_a_400(ckpt_a, serve):
    server = serve(ckpt_a)
    status, answer = raw_exchange(server.port,
                                  post("/v1/completions", "[" * 100_000 + "]" * 100_000))
    assert status == 400 and "bad request body" in answer["error"]


@pytest.fixture
def limited():
    server = LimitedServer(ServerLimits(read_timeout_s=0.5, max_connections=3,
                                        max_body_bytes=1000, max_header_bytes=4096,
                                        max_headers=20))
    yield server
    server.stop()


def test_huge_heads_are_refused_with_431(limited):
    line = b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n"
    assert raw_exchange(limited.port, line)[0] == 431
    header = b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 10_000 + b"\r\n\r\n"
    assert raw_exchange(limited.port, header)[0] == 431
    many = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(50)) + b"\r\n"
    assert raw_exchange(limited.port, many)[0] == 431
    assert raw_exchange(limited.port, b"GET / HTTP/1.1\r\n\r\n")[0] == 200


def test_bodies_over_the_limit_are_refused_chunked_or_not(limited):
    chunk = b"%x\r\n%s\r\n" % (600, b"x" * 600)
    chunked = (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2
               + b"0\r\n\r\n")
    assert raw_exchange(limited.port, chunked)[0] == 413
    assert raw_exchange(limited.port, post("/", b"x" * 1001))[0] == 413
    assert raw_exchange(limited.port, post("/", b"x" * 1000)) == (200, {"ok": True,
                                                                        "bytes": 1000})


def test_a_slow_client_is_answered_408_and_closed(limited):
    with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")  # never finishes
        assert read_answer(sock)[0] == 408


def test_connections_past_the_cap_are_refused_and_idle_ones_time_out(limited):
    idle = [socket.create_connection(("127.0.0.1", limited.port), timeout=30)
            for _ in range(3)]
    try:
        with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as extra:
            assert read_answer(extra)[0] == 503
        assert [read_answer(s)[0] for s in idle] == [408] * 3  # the read timeout frees them
        assert raw_exchange(limited.port, b"GET / HTTP/1.1\r\n\r\n")[0] == 200
    finally:
        for sock in idle:
            sock.close()
