"""A plain tool-calling agent on the official ``openai`` client: it imports nothing from
agentrl. It offers one tool, ``calculate``, implemented here, and loops until the model
answers without calling a tool.

agentrl trains it unmodified (docs/harnesses.md): as a callable,
``run(task, client_config) -> str``, or as a command line (``python calc_agent.py``),
reading the endpoint from OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL and the task
from AGENTRL_TASK, and printing its final answer.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys
from fractions import Fraction

from openai import OpenAI

MAX_TURNS = 4
TOOLS = [{"type": "function", "function": {
    "name": "calculate",
    "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string",
        "description": 'Numbers with + - * / and parentheses, e.g. "(3 + 4) * 2".'}},
        "required": ["expression"]}}}]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """The exact value of an arithmetic expression, or an error message."""
    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: cannot evaluate {expression!r}: {exc}"
    if result.denominator == 1:
        return str(result.numerator)
    return f"{float(result):.6f}".rstrip("0").rstrip(".")


def run(task: dict, client_config: dict) -> str:
    """Play one task: call the model, run its tool calls, return its final answer."""
    client = OpenAI(base_url=client_config["base_url"], api_key=client_config["api_key"])
    messages = list(task["messages"])
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model=client_config["model"], messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculate(str(expression))})
    return ""


if __name__ == "__main__":
    config = {"base_url": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"],
              "model": os.environ["OPENAI_MODEL"]}
    print(run(json.loads(os.environ["AGENTRL_TASK"]), config))
    sys.exit(0)
