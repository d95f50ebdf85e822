"""The OpenAI-compatible endpoint attacked by an agent program or a local user (every
target on 127.0.0.1, every loop bounded): malformed numbers, empty stop strings, deep
JSON, a huge message that must not freeze the other sessions, sessions that pile up."""

from __future__ import annotations

import json
import threading

import openai
import pytest

from agentrl.config import RolloutConfig
from agentrl.engines.chat_server import ChatServer, serve_on_thread
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import load_pretrained, load_tokenizer
from agentrl.rollout.harness_endpoint import serving_sessions
from tests.engines.attack_tools import post, raw_exchange

MESSAGES = [{"role": "user", "content": "Hello."}]
FREEZE = "FREEZE-MARKER"


class HeldTokenizer:
    """The model's tokenizer, except that encoding a text holding FREEZE waits until
    ``release`` is set (what rendering a huge message costs, made visible)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.release = threading.Event()
        self.holding = threading.Event()

    def encode(self, text, *args, **kwargs):
        if FREEZE in text:
            self.holding.set()
            self.release.wait(60)
        return self.tokenizer.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.fixture
def start(tiny_dir):
    """Start an endpoint with chosen settings (`agentrl serve`'s: any key is a session)."""
    loops = []

    def run(tokenizer=None, **settings):
        tokenizer = tokenizer or load_tokenizer(tiny_dir)
        model = load_pretrained(tiny_dir, attention="torch").eval().requires_grad_(False)
        engine = TorchEngine(model, tokenizer, max_batch_size=4, max_len=512)
        server = ChatServer(engine, tokenizer, "tiny", serving_sessions(
            engine, tokenizer, RolloutConfig(max_new_tokens=4)), **settings)
        loop, port = serve_on_thread(server)
        loops.append(loop)
        return server, port

    yield run
    for loop in loops:
        loop.call_soon_threadsafe(loop.stop)


def chat(port: int, text: str, key: str = "k1") -> tuple[int, dict]:
    return raw_exchange(port, post("/v1/chat/completions", text,
                                   {"Authorization": f"Bearer {key}"}))


def good_request(port: int, key: str = "k1") -> tuple[int, dict]:
    return chat(port, json.dumps({"model": "tiny", "messages": MESSAGES}), key)


DEEP_ARGUMENTS = '{"a": ' * 1200 + "1" + "}" * 1200


@pytest.mark.parametrize(("text", "code"), [
    ('{"model": "tiny", "messages": MSG, "max_tokens": NaN}', "invalid_parameter"),
    ('{"model": "tiny", "messages": MSG, "max_tokens": Infinity}', "invalid_parameter"),
    ('{"model": "tiny", "messages": MSG, "seed": 1e400}', "invalid_parameter"),
    ('{"model": "tiny", "messages": MSG, "temperature": NaN}', "invalid_parameter"),
    ('{"model": "tiny", "messages": MSG, "stop": [""]}', "invalid_parameter"),
    ('{"model": "tiny", "messages": MSG, "stop": ""}', "invalid_parameter"),
    ("[" * 100_000 + "]" * 100_000, "invalid_json"),
    ('{"model": "tiny", "messages": MSG, "x": ' + "[" * 1200 + "]" * 1200 + "}",
     "invalid_json"),
    ('{"model": "tiny", "messages": MSG, "tools": [{"type": "function", "function": {'
     '"name": "f", "parameters": ' + "[" * 200 + "]" * 200 + "}}]}", "invalid_parameter"),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "hi"}, {"role": '
     '"assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", '
     '"function": {"name": "f", "arguments": ' + json.dumps(DEEP_ARGUMENTS) + '}}]}]}',
     "invalid_tool_calls"),
])
def test_malformed_requests_get_an_error_object_and_the_session_goes_on(start, text, code):
    server, port = start()
    status, answer = chat(port, text.replace("MSG", json.dumps(MESSAGES)))
    assert status == 400 and answer["error"]["code"] == code, answer
    assert good_request(port)[0] == 200  # the session was not left with a busy thread
    session = server.sessions["k1"]
    assert session.num_completions == 1 and not any(t.busy for t in session.threads)


def test_a_huge_message_does_not_freeze_the_other_sessions(start, tiny_dir):
    tokenizer = HeldTokenizer(load_tokenizer(tiny_dir))
    server, port = start(tokenizer)
    huge = json.dumps({"model": "tiny", "messages": [
        {"role": "user", "content": FREEZE + "x" * 200_000}]})
    answers = {}
    sender = threading.Thread(target=lambda: answers.setdefault("huge", chat(port, huge,
                                                                             "big")))
    sender.start()
    try:
        assert tokenizer.holding.wait(60), "the huge message was never rendered"
        # its rendering holds on (as a 10 MB message would): the other sessions answer
        assert [good_request(port, f"other-{i}")[0] for i in range(3)] == [200] * 3
    finally:
        tokenizer.release.set()
        sender.join(60)
    assert answers["huge"][0] in (200, 400)  # its own answer came too


def test_a_body_over_the_limit_is_refused_before_parsing(start):
    server, port = start(max_request_bytes=10_000)
    body = json.dumps({"model": "tiny", "messages": [{"role": "user",
                                                     "content": "x" * 20_000}]})
    status, answer = chat(port, body)
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    assert server.sessions["k1"].num_requests == 0


def test_idle_served_sessions_are_forgotten(start):
    now = [0.0]
    server, port = start(session_idle_s=100.0, clock=lambda: now[0])
    assert good_request(port, "old")[0] == 200
    now[0] = 50.0
    assert good_request(port, "recent")[0] == 200
    now[0] = 120.0  # "old" idle 120 s, "recent" 70 s
    assert good_request(port, "new")[0] == 200
    assert set(server.sessions) == {"recent", "new"}


def test_a_served_session_starts_afresh_instead_of_growing(start):
    server, port = start(max_session_requests=3)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="busy",
                           max_retries=0)
    for i in range(7):  # each a new conversation: a new thread of the session
        client.chat.completions.create(model="tiny", messages=[
            {"role": "user", "content": f"question {i}"}])
    session = server.sessions["busy"]
    assert session.num_requests == 1 and len(session.threads) == 1
