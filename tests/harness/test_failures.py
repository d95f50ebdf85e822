"""Nothing an agent program does stops the run: a crash, a hang, a budget passed, a
foreign model name, a malformed request or a final answer that is not text each end
that rollout with a named reason (masked; a program past its own budget is trained, as a
policy-caused failure: docs/robustness.md), the endpoint answers with OpenAI's error
objects, and the other rollouts of the same collection are fine."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from agentrl.engines.chat_server import ChatServer, serve_on_thread
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import load_pretrained, load_tokenizer
from agentrl.rollout.harness_endpoint import serving_sessions
from tests.harness.conftest import AGENTS, collect, harness_config

EXPECTED = ["harness_raised", "harness_timeout", "harness_budget", "harness_foreign_model",
            "harness_bad_request", "harness_bad_final", None, None]


def test_each_failure_invalidates_only_its_rollout_with_its_reason(tiny_dir) -> None:
    # no retries: each attempt fails the same way (tests/rollout/test_failure_classes.py retries)
    config = harness_config(tiny_dir, {"run": f"{AGENTS / 'broken_agents.py'}:run",
                                       "timeout_s": 3.0, "max_requests": 3}, group_size=8,
                            rollout={"max_retries": 0})
    with pytest.warns(RuntimeWarning):  # the first of each kind is reported
        result, _, _ = collect(config, tiny_dir)
    by_index = {int(r.rollout_id.rsplit("r", 1)[-1]): r for r in result.rollouts}
    assert [by_index[i].stats.error_kind for i in range(8)] == EXPECTED
    # a program past its own budget is policy-caused: trained with its reward, not masked
    assert [by_index[i].valid for i in range(8)] == [False, False, True, False, False, False,
                                                     True, True]
    assert "crashed" in by_index[0].stats.error and "3 s" in by_index[1].stats.error
    assert "3 requests is its budget" in by_index[2].stats.error
    assert "'gpt-4o' is not served" in by_index[3].stats.error
    assert result.invalid == {"agent": {k: 1 for k in EXPECTED if k and k != "harness_budget"}}
    assert result.kept == {"agent": {"harness_budget": 1}}
    assert result.num_played == {"agent": 8}
    # the crashed one still has the row of the request it made before crashing (masked)
    assert len(by_index[0].segments) == 1 and not by_index[0].trainable


@pytest.fixture(scope="module")
def endpoint(tiny_dir):
    """`agentrl serve`'s chat routes on a thread: any API key is a session."""

    from agentrl.config import RolloutConfig

    tokenizer = load_tokenizer(tiny_dir)
    model = load_pretrained(tiny_dir, attention="torch").eval().requires_grad_(False)
    engine = TorchEngine(model, tokenizer, max_batch_size=4, max_len=512)
    rollout = RolloutConfig(max_new_tokens=8)
    server = ChatServer(engine, tokenizer, "tiny", serving_sessions(engine, tokenizer, rollout),
                        aliases=("policy",))  # as `agentrl serve`: the training name too
    loop, port = serve_on_thread(server)
    yield f"http://127.0.0.1:{port}", server
    loop.call_soon_threadsafe(loop.stop)


MESSAGES = [{"role": "user", "content": "Hello."}]


@pytest.mark.parametrize(("call", "error", "code"), [
    (lambda c: c.chat.completions.create(model="gpt-4o", messages=MESSAGES),
     openai.NotFoundError, "model_not_found"),
    (lambda c: c.chat.completions.create(model="tiny", messages=[{"role": "wizard",
                                                                  "content": "x"}]),
     openai.BadRequestError, "invalid_role"),
    (lambda c: c.chat.completions.create(model="tiny", messages=[]),
     openai.BadRequestError, "invalid_messages"),
    (lambda c: c.chat.completions.create(model="tiny", messages=MESSAGES, n=2),
     openai.BadRequestError, "unsupported_n"),
    (lambda c: c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]),
     openai.BadRequestError, "unsupported_content"),
])
def test_refusals_are_openai_error_objects(endpoint, call, error, code) -> None:
    client = openai.OpenAI(base_url=endpoint[0] + "/v1", api_key="k1", max_retries=0)
    with pytest.raises(error) as info:
        call(client)
    assert info.value.body["code"] == code and info.value.body["message"]
    assert info.value.body["type"] == "invalid_request_error"


def test_the_folders_name_and_the_training_name_are_both_served(endpoint) -> None:
    client = openai.OpenAI(base_url=endpoint[0] + "/v1", api_key="names", max_retries=0)
    for name in ("tiny", "policy"):  # a program written for training runs unchanged
        assert client.chat.completions.create(model=name, messages=MESSAGES).choices
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError, match="serves 'tiny' or 'policy'"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)


def test_no_session_is_an_authentication_error(endpoint) -> None:
    request = urllib.request.Request(endpoint[0] + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"model": "tiny",
                                                      "messages": MESSAGES}).encode())
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 401
    assert json.load(info.value)["error"]["code"] == "missing_session"


def test_the_session_comes_from_the_path_a_header_or_the_key(endpoint) -> None:
    url, server = endpoint
    for base, key, headers, session in [
            (url + "/sessions/by-path/v1", "unused", {}, "by-path"),
            (url + "/v1", "unused", {"X-Agentrl-Session": "by-header"}, "by-header"),
            (url + "/v1", "by-key", {}, "by-key")]:
        client = openai.OpenAI(base_url=base, api_key=key, default_headers=headers)
        client.chat.completions.create(model="tiny", messages=MESSAGES)
        assert server.sessions[session].num_completions == 1
        described = client.get("/agentrl/session", cast_to=object)
        assert described["session"] == session and described["threads"][0]["rows"]
    assert "unused" not in server.sessions


def test_a_streamed_answer_is_the_same_completion(endpoint) -> None:
    url, server = endpoint
    client = openai.OpenAI(base_url=url + "/v1", api_key="stream")
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        seed=3, temperature=0.0))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    usage = chunks[-1].usage
    plain = openai.OpenAI(base_url=url + "/v1", api_key="plain").chat.completions.create(
        model="tiny", messages=MESSAGES, seed=3, temperature=0.0)
    assert text == plain.choices[0].message.content and finish == plain.choices[0].finish_reason
    assert usage.completion_tokens == plain.usage.completion_tokens > 0
