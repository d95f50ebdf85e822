"""Model texts of each tool-call format, valid and malformed, with the calls they hold.

Shared by ``tests/models/test_parsers.py`` (agentrl's parsers) and
``tests/test_vllm_cpu/test_tool_parsers_agree.py`` (vLLM's own parsers give the same calls
on the same texts). ``CORPUS[format]`` is a list of (text, expected calls as (name,
arguments) pairs, error kinds agentrl reports).
"""

from __future__ import annotations

from agentrl.envs.parsers.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP

DS_CALL = CALLS_BEGIN + CALL_BEGIN + "function" + SEP + "{name}\n```json\n{args}\n```" + CALL_END

Call = tuple[str, dict]
Case = tuple[str, list[Call], list[str]]

CORPUS: dict[str, list[Case]] = {
    "hermes": [
        ('<tool_call>\n{"name": "search", "arguments": {"query": "rust"}}\n</tool_call>',
         [("search", {"query": "rust"})], []),
        ('Let me look.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
         '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n'
         '</tool_call>', [("add", {"a": 1, "b": 2}), ("search", {"query": "x"})], []),
        ("The answer is 42.", [], []),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>', [],
         ["malformed_json"]),
    ],
    "qwen3_coder": [
        ("<tool_call>\n<function=search>\n<parameter=query>\nrust traits\n</parameter>\n"
         "</function>\n</tool_call>", [("search", {"query": "rust traits"})], []),
        ("I will add.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"
         "<parameter=b>\n2.5\n</parameter>\n</function>\n</tool_call>",
         [("add", {"a": 1, "b": 2.5})], []),
        ("No tools needed: 7.", [], []),
        ("<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n",
         [], ["malformed_call"]),
    ],
    "llama3_json": [
        ('{"name": "search", "parameters": {"query": "rust"}}',
         [("search", {"query": "rust"})], []),
        ('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}',
         [("add", {"a": 1, "b": 2})], []),
        ('{"name": "add", "parameters": {"a": 1, "b": 2}}; '
         '{"name": "search", "parameters": {"query": "x"}}',
         [("add", {"a": 1, "b": 2}), ("search", {"query": "x"})], []),
        ("The answer is 42.", [], []),
        ('{"answer": 42}', [], []),
        ('{"name": "add", "parameters": {"a": 1', [], ["malformed_json"]),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "search", "arguments": {"query": "rust"}}]',
         [("search", {"query": "rust"})], []),
        ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}, '
         '{"name": "search", "arguments": {"query": "x"}}]',
         [("add", {"a": 1, "b": 2}), ("search", {"query": "x"})], []),
        ("The answer is 42.", [], []),
        ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1,}}]', [], ["malformed_json"]),
    ],
    "harmony": [
        ('<|channel|>analysis<|message|>Need to search.<|end|><|start|>assistant'
         '<|channel|>commentary to=functions.search <|constrain|>json<|message|>'
         '{"query": "rust"}<|call|>', [("search", {"query": "rust"})], []),
        ('<|channel|>commentary to=functions.add <|constrain|>json<|message|>'
         '{"a": 1, "b": 2}<|call|>', [("add", {"a": 1, "b": 2})], []),
        ("<|channel|>final<|message|>The answer is 42.<|return|>", [], []),
        ('<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1,<|call|>',
         [], ["malformed_json"]),
    ],
    "deepseek_v3": [
        (DS_CALL.format(name="search", args='{"query": "rust"}') + CALLS_END,
         [("search", {"query": "rust"})], []),
        (CALLS_BEGIN + CALL_BEGIN + "function" + SEP + 'add\n```json\n{"a": 1, "b": 2}\n```'
         + CALL_END + CALL_BEGIN + "function" + SEP + 'search\n```json\n{"query": "x"}\n```'
         + CALL_END + CALLS_END, [("add", {"a": 1, "b": 2}), ("search", {"query": "x"})], []),
        ("The answer is 42.", [], []),
        (CALLS_BEGIN + CALL_BEGIN + "function" + SEP + 'add\n```json\n{"a": 1',
         [], ["malformed_call"]),
    ],
}

SCHEMAS = {
    "search": {"type": "object", "properties": {"query": {"type": "string"}},
               "required": ["query"]},
    "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
            "required": ["a", "b"]},
}
"""The tools the corpus calls (JSON parameters schemas)."""
