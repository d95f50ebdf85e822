"""The base model's curriculum: drills whose scripted policy is right, whose summaries keep
what the question needs (or, for the weak demonstrators, something else), and whose tasks
vary in every way a new environment might."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.curriculum.drills import NAMES, DrillEnv, expected_answer, labelled_answer
from agentrl.model.tiny import tiny_tokenizer
from agentrl.reassembler import to_rows
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.train.sft import tokenizer_corpus


def play_script(env: DrillEnv, seed: int) -> tuple[float, list[str]]:
    """The scripted policy from reset to the answer; its reward and unforced summaries."""
    env.reset(seed=seed)
    summaries = []
    while True:
        summary = env.demonstrate_summary(env.history, forced=False)
        if summary is not None:
            summaries.append(summary)
        _, reward, done, truncated, _ = env.step(env.demonstrate(env.history))
        if done or truncated:
            return reward, summaries


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), max_pages=st.integers(1, 12))
def test_the_script_answers_every_task_and_its_summaries_hold_what_the_question_needs(
        seed, max_pages):
    env = DrillEnv(max_pages=max_pages, facts_per_page=3)
    reward, summaries = play_script(env, seed)
    assert reward == 1.0
    lines = env.needed_facts()
    assert 1 <= len(lines) <= 2 and all(any(line in p for p in env.pages) for line in lines)
    if summaries:  # the last summary holds every needed fact read before it
        assert any(line in summaries[-1] for line in lines)
    first_needed = [i for i, p in enumerate(env.pages) if any(line in p for line in lines)]
    # a summary right after each needed page but the last page
    assert len(summaries) == len([i for i in first_needed if i < len(env.pages) - 1])


def test_tasks_vary_in_pages_questions_and_formats():
    env = DrillEnv(max_pages=12)
    tasks = [env.sample_task(__import__("numpy").random.default_rng(s)) for s in range(200)]
    assert len({len(t.answer["pages"]) for t in tasks}) == 12
    assert {t.answer["question"] for t in tasks} == {"one", "two", "sum"}
    assert len({t.answer["summary"] for t in tasks}) == 4
    sums = [t for t in tasks if t.answer["question"] == "sum"]
    assert all(expected_answer(t.answer) == str(sum(int(v) for _, v in t.answer["needed"]))
               for t in sums)


@pytest.mark.parametrize("answer, reward", [("<answer>{}</answer>", 1.0),
                                            ("<answer>{}.</answer>", 1.0),
                                            ("<answer>x{}</answer>", 0.0),
                                            ("{}", 1.0), ("no tags {}", 0.0)])
def test_grading_needs_the_exact_answer_bare_or_labelled(answer, reward):
    env = DrillEnv(max_pages=4)
    env.reset(seed=5)  # a sum: "wheel = 0, ring = 1, sum = 1" or "1"
    assert labelled_answer(env.task.answer) == "wheel = 0, ring = 1, sum = 1"
    for text in (expected_answer(env.task.answer), labelled_answer(env.task.answer)):
        assert env.grade(answer.format(text)).reward == reward
    assert env.grade("<answer>wheel = 1, ring = 1, sum = 1</answer>").reward == 0.0


def test_read_all_scores_an_answer_given_before_the_last_page_zero():
    for read_all, early_reward in ((False, 1.0), (True, 0.0)):
        env = DrillEnv(min_pages=3, max_pages=3, questions=("one",), read_all=read_all)
        env.reset(seed=2)
        right = f"<answer>{expected_answer(env.task.answer)}</answer>"
        env.read()
        assert env.grade(right).reward == early_reward
        env.read(), env.read()
        assert env.grade(right).reward == 1.0
        assert env.grade("<answer>none</answer>").reward == 0.0


def test_weak_demonstrators_compact_at_the_same_moments_but_keep_other_facts():
    kept = {"needed": 0, "random": 0, "none": 0}
    moments = {}
    for keeps in kept:
        env = DrillEnv(max_pages=6, facts_per_page=3, questions=("one",), keeps=keeps)
        moments[keeps] = []
        for seed in range(40):
            reward, summaries = play_script(env, seed)
            assert reward == 1.0  # the answer is right: only the summary is weak
            moments[keeps].append(len(summaries))
            kept[keeps] += sum(any(line in s for line in env.needed_facts())
                               for s in summaries)
    assert moments["needed"] == moments["random"] == moments["none"]
    assert kept["none"] == 0 < kept["random"] < kept["needed"] == sum(moments["needed"])


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="keeps='all' unknown"):
        DrillEnv(keeps="all")
    with pytest.raises(ValueError, match="questions"):
        DrillEnv(questions=("why",))
    with pytest.raises(ValueError, match="distinct names; at most 40"):
        DrillEnv(max_pages=20, facts_per_page=3)
    with pytest.raises(ValueError, match="facts_per_page must be at least 2, got 1"):
        DrillEnv(facts_per_page=1, asked_on_first=True)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), question=st.sampled_from(["one", "two", "sum"]))
def test_asked_on_first_puts_every_asked_fact_among_the_first_pages_facts(seed, question):
    env = DrillEnv(min_pages=2, max_pages=6, facts_per_page=3, questions=(question,),
                   asked_on_first=True)
    env.reset(seed=seed)
    first, *rest = env.task.answer["pages"]
    lines = env.needed_facts()
    assert len(lines) == (1 if question == "one" else 2)
    assert all(line in first and not any(line in page for page in rest) for line in lines)
    facts = [line for line in first.splitlines()[1:] if line.strip() and any(
        name in line.replace(":", " ").replace("=", " ").split() for name in NAMES)]
    assert len(facts) == 3  # a full first page: which fact to keep is a real choice


def test_the_base_config_plays_under_its_budget_and_compacts():
    config = load_config("configs/base.toml")
    # the tokenizer `agentrl sft --base new` fits to the drills' text (as assets/base's)
    corpus = tokenizer_corpus(config, num_rollouts=40, chat_template="compact")
    tokenizer = tiny_tokenizer(vocab_size=1024, corpus=corpus, chat_template="compact")
    rollouts = asyncio.run(play_demonstrations(config, tokenizer, 24, seed=0))
    assert len(rollouts) == 24
    rows = to_rows(rollouts)
    assert len(rows) > len(rollouts)  # long reads compact into several rows
    budget = config.compaction.max_context_tokens + config.rollout.max_new_tokens
    assert max(len(r.token_ids) for r in rows) <= budget


def test_sft_refuses_a_new_models_options_with_a_base_in_one_line(tmp_path, capsys):
    argv = ["sft", "configs/base.toml", "--out", str(tmp_path / "x"), "--hidden-size", "64"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --hidden-size shape a new tiny model: add --base new or --base curriculum (they "
        "do not apply to --base base)")
    assert not (tmp_path / "x").exists()


def test_the_generic_base_is_the_default_and_a_missing_one_names_the_fix(monkeypatch,
                                                                         tmp_path):
    from agentrl.commands.sft import resolve_base
    from agentrl.model import base

    args = __import__("argparse").Namespace(base="base", hidden_size=None, num_layers=None,
                                            vocab_size=None, chat_template=None)
    monkeypatch.setattr(base, "GENERIC_BASE", tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="--base new for a new tiny model"):
        resolve_base(args)
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "config.json").write_text("{}")
    assert resolve_base(args) == str(tmp_path / "nowhere")
    args.base, args.hidden_size = "new", 64
    assert resolve_base(args) is None
