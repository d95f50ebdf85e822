"""The chat templates of the tiny checkpoints: Qwen2.5's, with Hermes-style tool calls,
and a compact variant.

Tool schemas go into the system message (Qwen2.5: as JSON inside <tools></tools> under
its fixed instructions, ~150 tokens before the first schema; ``compact``: one line per
tool, ``name(arguments): description``); the assistant calls a tool with
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``; tool results come back as a
user turn wrapping each result in <tool_response></tool_response>. Both render messages
identically. The compact one exists for tiny models on small context budgets, where
Qwen2.5's tool preamble alone would fill most of the context.
"""

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

_QWEN25_SYSTEM = (
    """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '"""
    + DEFAULT_SYSTEM_PROMPT
    + """' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\n"""
    + DEFAULT_SYSTEM_PROMPT
    + """<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
"""
)

_MESSAGES = (
    """{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
)

_COMPACT_SYSTEM = (
    """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] }}
{%- else %}
    {{- '<|im_start|>system\\n"""
    + DEFAULT_SYSTEM_PROMPT
    + """' }}
{%- endif %}
{%- if tools %}
    {{- '\\nTools:' }}
    {%- for tool in tools %}
        {{- '\\n- ' + tool.function.name + '('
            + (tool.function.parameters.properties | list | join(', '))
            + '): ' + tool.function.description }}
    {%- endfor %}
    {{- '\\nCall a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
"""
)

QWEN25_CHAT_TEMPLATE = _QWEN25_SYSTEM + _MESSAGES
COMPACT_CHAT_TEMPLATE = _COMPACT_SYSTEM + _MESSAGES
CHAT_TEMPLATES = {"qwen2.5": QWEN25_CHAT_TEMPLATE, "compact": COMPACT_CHAT_TEMPLATE}
"""The tiny checkpoints' templates by name (``agentrl sft --chat-template``)."""
