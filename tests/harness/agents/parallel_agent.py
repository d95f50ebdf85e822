"""A harness that runs two sub-conversations concurrently between two turns of its main
one (its own subagents), with the official client from two threads. It imports nothing
from agentrl."""

from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI


def run(task: dict, client_config: dict) -> str:
    client = OpenAI(base_url=client_config["base_url"], api_key=client_config["api_key"])
    model = client_config["model"]

    def ask(messages: list) -> str:
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6)
        return reply.choices[0].message.content or ""

    main = list(task["messages"])
    main.append({"role": "assistant", "content": ask(main)})
    system = main[0]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, [[system, {"role": "user", "content": f"Part {i}?"}]
                                      for i in (1, 2)]))
    main.append({"role": "user", "content": "Helpers said: " + " | ".join(answers)})
    return ask(main)
