"""`agentrl plan`'s longest row covers a harness program's rows: compaction never cuts a
program's own context, so a request's prompt runs up to the engine's context and its row
(prompt + generated, as the recorder keeps it) one token past it."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.config import ConfigError
from agentrl.engines.build import engine_max_len
from agentrl.engines.chat_api import ChatRequest
from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import load_pretrained, load_tokenizer, read_args
from agentrl.rollout.harness_session import HarnessSession, SessionLimits
from agentrl.train.preflight_facts import Preflight
from agentrl.train.preflight_sizes import check_micro_batch_budget, check_positions
from tests.harness.conftest import CALC_AGENT, harness_config

NEW_TOKENS = 8


def _session(tokenizer) -> HarnessSession:
    # no stop token: the engine's context alone ends the generation
    return HarnessSession("s", tokenizer, SessionLimits(4, NEW_TOKENS, 1000),
                          lambda i, r, n: SamplingParams(max_tokens=n, seed=i),
                          lambda g: [0] * len(g.token_ids))


def _config(tiny_dir, max_context_tokens: int, **sections):
    return harness_config(tiny_dir, {"run": f"{CALC_AGENT}:run"},
                          rollout={"max_new_tokens": NEW_TOKENS},
                          compaction={"strategy": "drop_oldest",
                                      "max_context_tokens": max_context_tokens}, **sections)


def test_a_harness_row_fits_the_plans_longest_row_with_compaction_on(tiny_dir) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    request = ChatRequest(model="m", messages=[
        {"role": "system", "content": "You help. " * 10},
        {"role": "user", "content": "A long task: " + "7 + 8 = ? " * 12}])
    prompt = len(_session(tokenizer).begin(request).prompt_ids)
    # the engine's context is then prompt + 1 (compaction budget + a turn + 1)
    config = _config(tiny_dir, max_context_tokens=prompt - NEW_TOKENS)
    positions = read_args(tiny_dir).max_position_embeddings
    max_len = engine_max_len(config, positions)
    assert max_len == prompt + 1
    engine = TorchEngine(load_pretrained(tiny_dir, attention="torch").eval(), tokenizer,
                         max_batch_size=1, max_len=max_len)
    session = _session(tokenizer)
    turn = session.begin(request)
    generation = asyncio.run(engine.generate(turn.prompt_ids, turn.params))
    session.finish(turn, generation, {"role": "assistant", "content": "x"})
    session.close()
    (row,) = session.segments()
    assert len(row.token_ids) == max_len + 1  # the program's prompt, uncompacted
    # the built-in loop's bound (context budget + a turn) is shorter than this row
    assert config.compaction.max_context_tokens + NEW_TOKENS < len(row.token_ids)
    pf = Preflight(config)
    bound = pf.longest_row
    assert bound.tokens == len(row.token_ids) and "harness request of agent" in bound.how
    assert pf.loop_row.tokens < bound.tokens
    # the micro-batch check now refuses a budget the row does not fit
    short = _config(tiny_dir, prompt - NEW_TOKENS,
                    batch={"max_tokens_per_microbatch": len(row.token_ids) - 1})
    with pytest.raises(ConfigError, match=f"at least {len(row.token_ids)}"):
        check_micro_batch_budget(Preflight(short))


def test_an_engine_context_at_the_models_positions_is_not_refused(tiny_dir) -> None:
    """The engine's context never passes the positions; the one token past it is a row's
    last, whose position predicts nothing: the positions check passes, the budget check
    still counts it."""
    positions = read_args(tiny_dir).max_position_embeddings
    config = _config(tiny_dir, max_context_tokens=positions - NEW_TOKENS,
                     batch={"max_tokens_per_microbatch": positions + 1})
    pf = Preflight(config)
    assert pf.longest_row.tokens == positions + 1 and pf.longest_row.engine_capped
    assert "positions: longest row" in check_positions(pf)
    assert "holds the longest row" in check_micro_batch_budget(pf)
    over = _config(tiny_dir, max_context_tokens=positions + 100,
                   batch={"max_tokens_per_microbatch": 2 * positions})
    with pytest.raises(ConfigError, match="passes the model's"):  # the loop's own rows
        check_positions(Preflight(over))
