"""A harness that sends back an edited assistant message (drift that cannot be bridged):
after its first request it replaces the model's reply by text of its own, then asks
again. It imports nothing from agentrl."""

from openai import OpenAI

EDITED = "I edited this reply."


def run(task: dict, client_config: dict) -> str:
    client = OpenAI(base_url=client_config["base_url"], api_key=client_config["api_key"])
    messages = list(task["messages"])
    client.chat.completions.create(model=client_config["model"], messages=messages,
                                   max_tokens=6)
    messages += [{"role": "assistant", "content": EDITED},
                 {"role": "user", "content": "Go on."}]
    reply = client.chat.completions.create(model=client_config["model"], messages=messages,
                                           max_tokens=6)
    return reply.choices[0].message.content or ""
