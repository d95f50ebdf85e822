"""Every built-in environment survives any text: random and adversarial model output.

For each built-in, one ``step`` per text (after ``reset``) must return in time with a
result that passes the runner's own contract check (a 5-tuple, a finite float reward, a
list of Messages whose content encodes as UTF-8 and is bounded, a dict info): no
exception escapes, no step is slow, nothing would invalidate a rollout. The texts are
the adversarial corpus (``agentrl.envs.adversarial``: the shapes of issue #13) and hypothesis
compositions of tags, tool-call shapes, huge numbers, unicode spaces, lone surrogates and
repetitions up to about 130,000 characters. Python-v0 is stepped only with calls to a tool
it does not have, so the fuzz never starts its sandbox (its own tests cover that).
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.config import RolloutConfig
from agentrl.envs.adversarial import cases, tool_call
from agentrl.envs.registry import BUILTINS, make
from agentrl.rollout.env_contract import check_step

STEP_DEADLINE_S = 2.0
"""Generous for a loaded shared machine: the slowest adversarial step measures ~0.05 s;
before the verifiers were linear, 16,000 spaces took 2-8 s and nested tags 38 s."""
MAX_CHARS = 130_000
TOOLS = {
    "agentrl/Calculator-v0": ("calculate", "expression"),
    "agentrl/KVStore-v0": ("lookup", "key"),
    "agentrl/Python-v0": ("no_such_tool", "code"),  # keeps the sandbox out of the fuzz
}
SMALL = {"agentrl/KVStore-v0": {"chain_length": 2, "padding_words": 4}}
ENV_IDS = sorted(BUILTINS)


def text_for(tool: str, argument: str) -> st.SearchStrategy[str]:
    """Concatenations of tags, tool-call shapes, numbers, unicode and repetitions."""
    pieces = st.sampled_from([
        "<answer>", "</answer>", "<tool_call>", "</tool_call>", "{", "}", "[", "]", '"',
        ":", ",", "\\boxed{", "}", "####", "the answer is ", "=", "-", "+", "$", ".",
        "e999", "9" * 400, "\ud800", "\udfff", "\u3000", "\u00a0", " ", "\n", "**",
        "1/3", "(", ")", "NaN", "Infinity", f'{{"name": "{tool}", "arguments": ',
        f'{{"{argument}": ', tool_call(tool, {argument: "(1+2)*3"}),
        tool_call(tool, {argument: "\ud800"}), tool_call(tool, "[[[["),
    ])
    characters = st.text(st.characters(categories=["Cs", "Zs", "Nd", "L", "P", "S", "Cc"]),
                         max_size=40)
    repeated = st.tuples(pieces, st.integers(1, 40_000)).map(
        lambda pair: pair[0] * min(pair[1], MAX_CHARS // len(pair[0])))
    numbers = st.integers(min_value=-(10**500), max_value=10**500).map(str)
    return st.lists(st.one_of(pieces, characters, repeated, numbers), max_size=10).map(
        lambda parts: "".join(parts)[:MAX_CHARS])


def step_once(env, seed: int, text: str) -> float:
    """Reset, one step, contract check; returns the step's seconds."""
    env.reset(seed=seed)
    start = time.perf_counter()
    result = env.step(text)
    seconds = time.perf_counter() - start
    checked = check_step("fuzz", result, RolloutConfig().max_observation_chars)
    assert type(checked.reward) is float and math.isfinite(checked.reward)
    for message in checked.observation:
        message.content.encode("utf-8")  # raises on a lone surrogate
    return seconds


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_adversarial_corpus(env_id):
    env = make(env_id, **SMALL.get(env_id, {}))
    slowest = max((step_once(env, 0, text), name)
                  for name, text in cases(*TOOLS.get(env_id, ("calculate", "expression")))
                  .items())
    assert slowest[0] < STEP_DEADLINE_S, slowest


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_hypothesis_text(env_id):
    env = make(env_id, **SMALL.get(env_id, {}))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(text=text_for(*TOOLS.get(env_id, ("calculate", "expression"))),
           seed=st.integers(0, 2**31 - 1))
    def check(text: str, seed: int) -> None:
        assert step_once(env, seed, text) < STEP_DEADLINE_S

    check()


@pytest.mark.parametrize("text, wanted", [
    (" " * 32_000, None), ("\u3000" * 32_000, None), ("<answer>" * 16_000, None),
    ("<answer>" + "9" * 400 + "</answer>", None), ("<answer>42</answer>", 42),
    ("The answer is 42.", 42), ("<answer> 42 </answer>", 42), ("- 5", -5), ("$ 1,000", 1000),
])
def test_number_only_on_the_issue_inputs(text, wanted):
    from environments._verify import number_only

    start = time.perf_counter()
    assert number_only(text) == wanted
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("text, wanted", [
    ("<answer><answer>7</answer>", "7"),  # nested: the innermost complete pair
    ("<answer>a</answer>b</answer>", "a"),  # the last opening tag before the last closing
    ("<answer>1</answer> then <answer>2</answer>", "2"),
    ("<answer>" * 16_000, None), ("no tags", None),
])
def test_last_tagged_is_linear_and_picks_the_last_pair(text, wanted):
    from environments._verify import last_tagged

    assert last_tagged(text) == wanted


def test_numbers_past_the_float_range_compare_exactly():
    from fractions import Fraction

    from environments._verify import extract_number, numbers_equal

    huge = extract_number("9" * 99)
    assert huge == Fraction(int("9" * 99)) and numbers_equal(huge, huge)
    assert not numbers_equal(huge, Fraction(3))
    assert extract_number("9" * 400) is None  # longer than MAX_NUMBER_CHARS: not an answer
    assert numbers_equal(Fraction(1, 3), Fraction(333333333, 1000000000), tolerance=1e-6)
