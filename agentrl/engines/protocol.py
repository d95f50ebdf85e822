"""Token-in/token-out over HTTP: the subset of vLLM's OpenAI-compatible ``/v1/completions``
that RL rollouts need, spoken by ``RemoteEngine`` and served by ``agentrl serve``.

A request sends the prompt as token ids, asks for the sampled token's log-prob
(``logprobs: 0``) and for the generated ids (``return_token_ids``; also
``return_tokens_as_token_ids`` so ``logprobs.tokens`` carry ``token_id:N``), with
``ignore_eos`` so only the caller's ``stop_token_ids`` end a generation. vLLM (0.32)
serves it unchanged when started with ``--logprobs-mode processed_logprobs`` and
``--generation-config vllm`` (see docs/vllm.md); nothing is ever re-tokenized.
"""

from __future__ import annotations

import time
from typing import Any

from agentrl.engines.interface import Generation, SamplingParams
from agentrl.engines.request_checks import number, stop_strings

TOKEN_ID_PREFIX = "token_id:"


def completion_request(prompt_ids: list[int], params: SamplingParams,
                       model: str | None = None, key: str | None = None) -> dict[str, Any]:
    """The JSON body of one completion request."""
    body: dict[str, Any] = {
        "prompt": list(prompt_ids), "max_tokens": params.max_tokens,
        "temperature": params.temperature, "top_p": params.top_p, "seed": params.seed,
        "stop": list(params.stop), "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": True, "skip_special_tokens": False, "logprobs": 0,
        "return_token_ids": True, "return_tokens_as_token_ids": True,
        "n": 1, "stream": False,
    }
    if model is not None:
        body["model"] = model
    if key is not None:  # vLLM: a stable id shared by the requests of one session
        body["session_id"] = key
    return body


def generation_from_response(answer: dict[str, Any], where: str) -> Generation:
    """The Generation in a completion response; ValueError naming ``where`` when the
    answer lacks token ids or log-probs, or the server ended the request early."""
    try:
        choice = answer["choices"][0]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        token_ids = choice.get("token_ids")
        if token_ids is None:  # older servers: ids only as "token_id:N" strings
            token_ids = [int(t.removeprefix(TOKEN_ID_PREFIX))
                         for t in choice["logprobs"]["tokens"]]
        finish = choice["finish_reason"]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"{where} answered without token ids and log-probs ({exc!r}); is "
                         "it vLLM >= 0.32 or `agentrl serve`?") from exc
    if len(token_ids) != len(logprobs):
        raise ValueError(f"{where} returned {len(token_ids)} tokens but {len(logprobs)} "
                         "log-probs")
    if finish not in ("stop", "length"):
        raise ValueError(f"{where} ended the request with finish_reason {finish!r}")
    return Generation(token_ids=[int(t) for t in token_ids], logprobs=logprobs,
                      finish_reason=finish)


def parse_completion_request(body: Any, eos_token_id: int | None) -> tuple[list[int],
                                                                          SamplingParams]:
    """Server side: the prompt ids and SamplingParams of a request; ValueError on
    anything this subset does not serve (text prompts, n > 1, streaming, echo) and on any
    value out of range (``agentrl.engines.request_checks``; the engine checks the ids
    against its vocabulary)."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    prompt = body.get("prompt")
    if not (isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt)):
        raise ValueError("prompt must be a non-empty list of token ids (this server takes "
                         "token ids only, never text)")
    for name, allowed in (("n", 1), ("stream", False), ("echo", False)):
        if body.get(name) not in (None, allowed):
            raise ValueError(f"{name} = {body[name]!r} is not served; use {allowed!r}")
    stop_ids = body.get("stop_token_ids") or []
    if not (isinstance(stop_ids, list) and all(_is_id(t) for t in stop_ids)):
        raise ValueError("stop_token_ids must be a list of token ids")
    stop_ids = tuple(stop_ids)
    if not body.get("ignore_eos", False) and eos_token_id is not None:
        stop_ids = (*stop_ids, eos_token_id)
    params = SamplingParams(
        temperature=number(body, "temperature", float, 1.0),
        top_p=number(body, "top_p", float, 1.0),
        max_tokens=number(body, "max_tokens", int, 16),
        stop_token_ids=stop_ids, stop=stop_strings(body.get("stop")),
        seed=number(body, "seed", int),
    )
    return list(prompt), params


def _is_id(value: Any) -> bool:
    """A token id's type and sign (its range is the engine's vocabulary)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def completion_response(generation: Generation, model: str, num_prompt_tokens: int,
                        request_id: str, text: str = "") -> dict[str, Any]:
    """Server side: a Generation as a ``text_completion`` answer."""
    ids = generation.token_ids
    return {
        "id": request_id, "object": "text_completion", "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0, "text": text, "token_ids": ids,
            "logprobs": {"tokens": [f"{TOKEN_ID_PREFIX}{t}" for t in ids],
                         "token_logprobs": generation.logprobs,
                         "top_logprobs": [], "text_offset": []},
            "finish_reason": generation.finish_reason, "stop_reason": None,
        }],
        "usage": {"prompt_tokens": num_prompt_tokens, "completion_tokens": len(ids),
                  "total_tokens": num_prompt_tokens + len(ids)},
    }
