"""Adversarial model text: the shapes that crashed or hung environments (issue #13).

Used by ``agentrl check-env --adversarial`` (every text through an environment's
``step``, under the runner's containment), by ``bench/env_adversarial.py`` and by the fuzz
test. Every text is at most about 128,000 characters: far more than a model writes in
one turn, enough to expose quadratic matching.
"""

from __future__ import annotations

import json
from typing import Any


def tool_call(name: str, arguments: Any) -> str:
    """A well-formed Hermes tool call."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def cases(tool: str = "calculate", argument: str = "expression") -> dict[str, str]:
    """Named adversarial texts; the tool-call shapes call ``tool`` with its string
    parameter ``argument`` (an environment's own tool reaches its code)."""
    head = f'<tool_call>{{"name": "{tool}", "arguments": '
    return {
        "16k spaces": " " * 16_000,
        "32k spaces": " " * 32_000,
        "32k ideographic spaces": "\u3000" * 32_000,
        "minus then 32k spaces": "-" + " " * 32_000 + "x",
        "dollar then 32k spaces": "$" + " " * 32_000 + "x",
        "128k nested <answer>": "<answer>" * 16_000,
        "nested <answer> closed": "<answer>" * 16_000 + "1</answer>",
        "<answer> 400 digits": f"<answer>{'9' * 400}</answer>",
        "400 digits": "9" * 400,
        "40k digits": "9" * 40_000,
        "1e999 in answer": "<answer>1e999</answer>",
        "huge decimal": "<answer>0." + "9" * 5000 + "</answer>",
        "9**9**9": "9**9**9",
        "tagged 9**9**9": "<answer>9**9**9</answer>",
        "30k ####": "####" * 30_000,
        "20k \\boxed{": "\\boxed{" * 20_000,
        "answer is x10k": "the answer is " * 10_000,
        "commas 100k": "1," * 50_000,
        "lone surrogate": "\ud800",
        "surrogate answer": "<answer>\udfff42</answer>",
        "deep json": "<tool_call>" + "[" * 100_000 + "</tool_call>",
        "deep json object": head + '{"a": ' * 50_000 + "</tool_call>",
        "bad json": f"<tool_call>{{name: {tool}}}</tool_call>",
        "unclosed call": "<tool_call>" * 10_000,
        "many calls": tool_call(tool, {argument: "1+1"}) * 2_000,
        "surrogate in args": head + f'{{"{argument}": "\\ud800"}}}}</tool_call>',
        "surrogate pair in args": head + f'{{"{argument}": "\\ud83d\\ude00"}}}}</tool_call>',
        "1e999 argument": tool_call(tool, {argument: "1e999 * 2"}),
        "huge product": tool_call(tool, {argument: "*".join(["9" * 20] * 14)}),
        "huge tool name": tool_call("x" * 100_000, {}),
        "huge argument": tool_call(tool, {argument: "1+" * 50_000 + "1"}),
        "nested parens": tool_call(tool, {argument: "(" * 200 + "1" + ")" * 200}),
        "argument 1e400": head + f'{{"{argument}": 1e400}}}}</tool_call>',
        "argument NaN": head + f'{{"{argument}": NaN}}}}</tool_call>',
        "big int json": head + f'{{"{argument}": ' + "9" * 5000 + "}}</tool_call>",
        "double encoded deep": head + '"' + "[" * 50_000 + '"}</tool_call>',
        "many unknown args": tool_call(tool, {f"k{i}": i for i in range(5_000)}),
    }
