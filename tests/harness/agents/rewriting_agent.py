"""A harness that rewrites its history every third turn: on requests 3, 6, ... it sends
the system prompt, the task and a summary instead of the turns so far. It imports nothing
from agentrl. How many requests it makes and its final answer depend on the rollout (so
a test can work the advantages out by hand): rollouts ending in r0 make 6 requests and
answer "yes", r1 3 and "no", r2 2 and "no"."""

from openai import OpenAI

REQUESTS = {"r0": 6, "r1": 3, "r2": 2}


def summary(turn: int) -> dict:
    return {"role": "user", "content": f"Summary of the first {turn} turns: keep going."}


def run(task: dict, client_config: dict) -> str:
    client = OpenAI(base_url=client_config["base_url"], api_key=client_config["api_key"])
    which = task["rollout_id"].rsplit("-", 1)[-1]
    head = list(task["messages"])
    messages = list(head)
    for turn in range(1, REQUESTS[which] + 1):
        if turn % 3 == 0:  # rewrite: the turns so far become one summary message
            messages = [*head, summary(turn - 1)]
        reply = client.chat.completions.create(model=client_config["model"],
                                               messages=messages, max_tokens=6)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": f"Turn {turn} done; continue."})
    return "yes" if which == "r0" else "no"
