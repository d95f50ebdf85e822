"""DocQA: the code sits on one page of two documents, each with its reader's task longer than
the context; readers find it (labelled answers a tiny model can copy), the main thread alone
runs out of turns."""

from __future__ import annotations

import asyncio
import functools

import msgspec
import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.model.tiny import tiny_tokenizer
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.train.sft import tokenizer_corpus
from environments.docqa import DocQAEnv

DOCQA_CONFIG = "configs/docqa.toml"


@functools.cache
def fitted_tokenizer():
    """A tokenizer fitted to DocQA's text the way ``agentrl sft`` fits a new tiny model's
    (on fewer episodes, enough for the same 812 ids as its 300): the token counts the
    config's budgets are set for."""
    config = load_config(DOCQA_CONFIG)
    corpus = tokenizer_corpus(config, num_rollouts=40, chat_template="compact")
    return tiny_tokenizer(0, 1024, corpus, 4096, "compact")


def test_readers_answer_a_labelled_copy_of_the_page_and_the_main_thread_copies_it():
    config = load_config(DOCQA_CONFIG)
    rollouts = asyncio.run(play_demonstrations(config, fitted_tokenizer(), 4, seed=0))
    for rollout in rollouts:
        assert rollout.reward == 1.0 and len(rollout.threads) == 2
        found, none = sorted(t.answer for t in rollout.threads)
        assert none == "none" and found.startswith("found #")
        assert found.removeprefix("found #").isdigit()
    env = DocQAEnv()
    env.reset(seed=0)
    code, pages = env.task.answer["code"], [p for d in env.task.answer["docs"] for p in d]
    # the label and the digits as the page writes them: the answer's " #1234" is a copy
    assert sum(f"is #{code} ." in page for page in pages) == 1


@pytest.mark.parametrize("answer, correct", [
    ("<answer>found #{code}</answer>", 1.0),
    ("<answer>{code}</answer>", 1.0),
    ("found #{code}", 1.0),
    ("<answer>found #{other}</answer>", 0.0),
    ("<answer>none</answer>", 0.0),
])
def test_grading_reads_the_code_with_or_without_its_label(answer, correct):
    env = DocQAEnv()
    env.reset(seed=3)
    code = env.task.answer["code"]
    grade = env.grade(answer.format(code=code, other=code + 1 if code < 9999 else 1000))
    assert grade.reward == correct and grade.components["correct"] == correct


def test_a_document_does_not_fit_the_shipped_context_and_one_page_does():
    """A reader's task and whole document (played without compaction) are over
    compaction.max_context_tokens; every compacted context a demonstration used is
    within it (the task and one page)."""
    config = load_config(DOCQA_CONFIG)
    tokenizer = fitted_tokenizer()
    budget = config.compaction.max_context_tokens
    whole = msgspec.structs.replace(
        config, compaction=msgspec.structs.replace(config.compaction, strategy="none"),
        rollout=msgspec.structs.replace(config.rollout, max_subagent_tokens=4096))
    rollouts = asyncio.run(play_demonstrations(whole, tokenizer, 8, seed=1))
    readers = [s for r in rollouts for s in r.segments if s.thread != "main"]
    longest = max(len(s.token_ids) for s in readers)
    assert longest > budget  # a reader that read both pages held more than the context
    compacted = asyncio.run(play_demonstrations(config, tokenizer, 8, seed=1))
    assert all(s.num_prompt_tokens <= budget for r in compacted for s in r.segments)


def test_without_subagents_the_turns_reach_only_part_of_the_collection():
    """Under configs/docqa.toml's rollout.max_turns the main thread alone reads two of the
    four pages: its scripted policy solves only the tasks whose code is in document 0
    (the demonstrations keep the correct episodes only)."""
    config = load_config(DOCQA_CONFIG, ["environments.0.kwargs={delegate=false}"])
    rollouts = asyncio.run(play_demonstrations(config, fitted_tokenizer(), 24, seed=0))
    assert all(not r.threads and r.reward == 1.0 for r in rollouts)
    assert 0 < len(rollouts) < 24


def test_the_bench_control_gets_the_whole_trees_budget_in_its_one_thread():
    """bench/subagents.py's control: the main thread alone, in the same context window,
    with the turns, generated tokens and compactions of the main thread and
    rollout.max_subagents_per_rollout readers together; under it the scripted policy reads
    as many pages as it needs and solves every task."""
    from bench.subagents import variant_overrides

    tree = load_config(DOCQA_CONFIG)
    config = load_config(DOCQA_CONFIG, variant_overrides("alone"))
    readers = tree.rollout.max_subagents_per_rollout
    assert config.rollout.max_turns == (1 + readers) * tree.rollout.max_turns == 15
    assert config.rollout.max_rollout_tokens == 680 == (
        tree.rollout.max_rollout_tokens + readers * tree.rollout.max_subagent_tokens)
    assert config.compaction.max_compactions == (1 + readers) * tree.compaction.max_compactions
    assert config.compaction.max_context_tokens == tree.compaction.max_context_tokens
    assert config.environments[0].kwargs == {"delegate": False, "max_turns": 15}
    assert variant_overrides("subagents") == []
    rollouts = asyncio.run(play_demonstrations(config, fitted_tokenizer(), 24, seed=0))
    assert len(rollouts) == 24 and all(not r.threads and r.reward == 1.0 for r in rollouts)


def test_the_weaker_demonstrator_searches_document_0_alone_on_the_rest_of_the_tasks():
    """With ``demo_search_share=0`` every demonstration searches document 0 only: the
    correct ones (the only ones trained on) found the code there; the tasks whose code is
    in document 1 are left out."""
    config = load_config(DOCQA_CONFIG, ["environments.0.kwargs={demo_search_share=0.0}"])
    rollouts = asyncio.run(play_demonstrations(config, fitted_tokenizer(), 16, seed=0))
    assert 0 < len(rollouts) < 16
    for rollout in rollouts:
        assert rollout.reward == 1.0 and len(rollout.threads) == 1
        assert rollout.threads[0].answer.startswith("found #")


def test_the_search_share_is_a_stable_draw_per_task_and_must_be_a_share():
    """At share 0.5 some tasks' first main turn searches both documents and some only
    document 0, each task always the same way."""
    env = DocQAEnv(demo_search_share=0.5)
    first_turns = []
    for seed in range(12):
        messages, _ = env.reset(seed=seed)
        first = env.demonstrate(messages)
        assert env.demonstrate(messages) == first
        first_turns.append(first.count("search_document"))
    assert sorted(set(first_turns)) == [1, 2]
    every = DocQAEnv(demo_search_share=1.0)
    assert every.demonstrate(every.reset(seed=0)[0]).count("search_document") == 2
    with pytest.raises(ValueError, match="demo_search_share is 1.5; it must be in"):
        DocQAEnv(demo_search_share=1.5)


def test_check_env_draws_the_subagent_tree(capsys):
    """``agentrl check-env`` plays the scripted tree: under the main thread's calls, each
    reader's thread indented (its task, its reads), the answer it returns to the main
    thread, then the main thread's answer and the reward."""
    assert main(["check-env", "agentrl/DocQA-v0", "--episodes", "1", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    env = DocQAEnv()
    env.reset(seed=0)
    code, name, docs = (env.task.answer[k] for k in ("code", "name", "docs"))
    answers = [f"found #{code}" if any(f"#{code} ." in p for p in pages) else "none"
               for pages in docs]
    assert sorted(answers) == [f"found #{code}", "none"]
    call = out.index('{"name": "search_document", "arguments": {"doc": 1}}')
    ends = []
    for doc, answer in enumerate(answers):
        start = out.index(f"\n  └─ thread {doc + 1} ← search_document(doc={doc})\n"
                          f"    [user] Find the code of {name} in document {doc}. It has 2 "
                          "pages.\n    [assistant] <tool_call>\n")
        read = out.index(f"\n    [tool:read_page] document {doc} page 0 of 2\n", start)
        ends.append(out.index(f"\n      ↳ returns to thread main: {answer}\n", read))
        assert call < start
    results = "".join(f"\n[tool:search_document] {answer}" for answer in answers)
    final = out.index(f"{results}\n[assistant] <answer>found #{code}</answer>\n")
    assert ends[0] < ends[1] < final
    assert "episode 0 (seed 0): reward 1\n" in out and "gymnasium check_env: passed" in out
