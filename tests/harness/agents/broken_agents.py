"""Harnesses that go wrong in each way the endpoint must survive. They import nothing
from agentrl; each is chosen per rollout by the end of its id (see ``run``)."""

import json
import time
import urllib.error
import urllib.request

from openai import OpenAI


def _client(config: dict) -> OpenAI:
    return OpenAI(base_url=config["base_url"], api_key=config["api_key"], max_retries=0)


def _messages(task: dict) -> list:
    return list(task["messages"])


def crash(task: dict, config: dict) -> str:
    _client(config).chat.completions.create(model=config["model"], messages=_messages(task),
                                            max_tokens=4)
    raise RuntimeError("the agent program crashed")


def hang(task: dict, config: dict) -> str:
    time.sleep(30)
    return "too late"


def over_budget(task: dict, config: dict) -> str:
    client, messages = _client(config), _messages(task)
    for _ in range(20):  # more requests than harness.max_requests
        client.chat.completions.create(model=config["model"], messages=messages,
                                       max_tokens=4)
    return "done"


def foreign_model(task: dict, config: dict) -> str:
    _client(config).chat.completions.create(model="gpt-4o", messages=_messages(task))
    return "done"


def malformed(task: dict, config: dict) -> str:
    # not JSON at all, straight over HTTP: the endpoint answers an OpenAI error object
    request = urllib.request.Request(
        config["base_url"] + "/chat/completions", data=b"{not json", method="POST",
        headers={"Authorization": f"Bearer {config['api_key']}"})
    try:
        urllib.request.urlopen(request)
    except urllib.error.HTTPError as exc:
        assert json.load(exc)["error"]["code"] == "invalid_json"
    return "done"


def not_text(task: dict, config: dict) -> str:
    return {"answer": 42}  # type: ignore[return-value]


def fine(task: dict, config: dict) -> str:
    reply = _client(config).chat.completions.create(model=config["model"],
                                                    messages=_messages(task), max_tokens=4)
    return reply.choices[0].message.content or ""


def run(task: dict, config: dict) -> str:
    """Group members r0..r7 each fail one way; r7 plays fine."""
    which = int(task["rollout_id"].rsplit("-r", 1)[-1])
    return [crash, hang, over_budget, foreign_model, malformed, not_text, fine, fine][which](
        task, config)
