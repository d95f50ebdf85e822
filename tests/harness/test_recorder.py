"""The recorder alone (``HarnessSession``), driven request by request as the endpoint
drives it: for any sequence of what a harness may do (extend, call tools, rewrite, drop
turns, retry, edit a reply) every row holds exactly what the engine saw and generated,
each generated token is trained once, and each request that does not extend the last one
starts exactly one new row, named for why."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentrl.engines.chat_api import ChatRequest, assistant_reply
from agentrl.engines.interface import Generation, SamplingParams
from agentrl.model import load_tokenizer
from agentrl.rollout.harness_session import HarnessSession, SessionLimits

HEAD = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Task."}]
OPS = st.lists(st.sampled_from(["extend", "tool", "rewrite", "drop", "retry", "edit"]),
               min_size=1, max_size=8)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return load_tokenizer(tiny_dir)


class Harness:
    """A scripted program: the messages it sends next, from what it got back."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.session = HarnessSession(
            "s", tokenizer, SessionLimits(100, 64, 10_000),
            lambda i, r, n: SamplingParams(max_tokens=n, stop_token_ids=(tokenizer.eos_token_id,)),
            lambda g: [0] * len(g.token_ids))
        self.calls: list[tuple[list[int], list[int]]] = []
        self.sent: list[dict] = []
        self.reply: dict | None = None
        self.ids = (f"c{i}" for i in itertools.count())

    def ask(self, messages: list[dict], text: str) -> None:
        request = ChatRequest(model="m", messages=[_canonical(m) for m in messages])
        turn = self.session.begin(request)
        ids = [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]
        self.session.finish(turn, Generation(ids, [-0.5] * len(ids), "stop"),
                            reply := assistant_reply(text, self.ids))
        self.calls.append((turn.prompt_ids, ids))
        self.sent, self.reply = messages, reply

    def next_messages(self, op: str, n: int) -> list[dict]:
        turns = [*self.sent, self.reply]
        if op == "extend":
            return [*turns, {"role": "user", "content": f"More {n}."}]
        if op == "tool":
            return [*turns, *({"role": "tool", "tool_call_id": c["id"], "content": str(n)}
                              for c in self.reply.get("tool_calls") or [])] or turns
        if op == "rewrite":
            return [*HEAD, {"role": "user", "content": f"Summary {n}."}]
        if op == "drop":
            return [*HEAD, *turns[-2:], {"role": "user", "content": f"Later {n}."}]
        if op == "retry":
            return list(self.sent)
        edited = [dict(m) for m in turns]
        edited[-1] = {"role": "assistant", "content": f"edited {n}"}
        return [*edited, {"role": "user", "content": "Go on."}]


def _canonical(message: dict) -> dict:
    out = dict(message)
    if out.get("content") is None:
        out["content"] = ""
    if out.get("tool_calls"):
        out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
            c["function"]["arguments"])}} for c in out["tool_calls"]]
    return out


def _text(n: int) -> str:
    if n % 2:  # a tool call in the model's own format
        call = json.dumps({"name": "lookup", "arguments": {"n": n}})
        return f"Let me look.\n<tool_call>\n{call}\n</tool_call>"
    return f"Answer number {n}."


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
@example(ops=["extend", "tool", "drop"])  # a kept reply lands where another reply stood
def test_rows_hold_exactly_what_the_engine_saw(tokenizer, ops) -> None:
    harness = Harness(tokenizer)
    harness.ask(list(HEAD), _text(1))
    expected = [""]
    for n, op in enumerate(ops, start=2):
        messages = harness.next_messages(op, n)
        before = [*harness.sent, harness.reply]
        extends = len(messages) > len(harness.sent) and messages[:len(before)] == before
        harness.ask(messages, _text(n))
        if not extends:
            expected.append("drift" if op == "edit" else "harness_compaction")
    session = harness.session
    session.close()
    rows = session.segments()
    assert [s.boundary.split(":")[0] for s in rows] == expected
    assert session.num_drift == expected.count("drift")
    assert sum(session.compactions.values()) == expected.count("harness_compaction")
    for prompt, generated in harness.calls:  # what the engine saw is a row's beginning
        end = len(prompt) + len(generated)
        assert any(r.token_ids[:end] == prompt + generated and all(r.loss_mask[len(prompt):end])
                   for r in rows)
    assert sum(r.num_generated_tokens for r in rows) == sum(len(g) for _, g in harness.calls)


def test_the_reasons_of_harness_compactions(tokenizer) -> None:
    harness = Harness(tokenizer)
    harness.ask(list(HEAD), "One.")
    for op in ("extend", "retry", "extend", "drop", "rewrite"):
        harness.ask(harness.next_messages(op, 0), "Two.")
    harness.session.close()
    assert dict(harness.session.compactions) == {"retry": 1, "dropped_messages": 1,
                                                 "rewritten": 1}


def test_concurrent_requests_share_the_token_budget(tokenizer) -> None:
    """Each request is granted only what requests in flight have not reserved: budget 40
    and three concurrent requests of up to 16 get 16, 16 and 8, never 3 x 16 (or, before,
    3 x 40 with a per-request cap of 40)."""
    from agentrl.engines.chat_api import ChatError

    session = HarnessSession(
        "s", tokenizer, SessionLimits(10, 16, 40),
        lambda i, r, n: SamplingParams(max_tokens=n, stop_token_ids=(tokenizer.eos_token_id,)),
        lambda g: [0] * len(g.token_ids))

    def request(n: int) -> ChatRequest:
        return ChatRequest(model="m", messages=[*HEAD[:1], {"role": "user",
                                                            "content": f"Branch {n}."}])

    turns = [session.begin(request(n)) for n in range(3)]
    assert [t.params.max_tokens for t in turns] == [16, 16, 8]
    with pytest.raises(ChatError, match="requests in flight hold 40"):
        session.begin(request(3))
    ids = [*tokenizer.encode("ok"), tokenizer.eos_token_id]
    session.finish(turns[0], Generation(ids, [-0.5] * len(ids), "stop"),
                   assistant_reply("ok", iter(["c0"])))
    session.abandon(turns[1])  # the client left: its grant returns to the budget
    assert session.begin(request(4)).params.max_tokens == 16
    assert session.num_generated_tokens + session.num_reserved_tokens <= 40
