"""``agentrl check-env`` checks the whole long-trace contract before any training: each
deliberately broken environment below fails it with one line naming the environment, the
method and the fix; a correct one passes; ``--set`` reaches the config it plays under."""

from __future__ import annotations

import re

import pytest

from agentrl.cli import main
from agentrl.envs import AgentEnv
from environments.ledger import LedgerEnv

HERE = "tests.env.test_check_env_contract"


class CorrectLedger(LedgerEnv):
    """Ledger as shipped: needed_facts and demonstrate_summary as the contract says."""


class FactsWithArgument(LedgerEnv):
    def needed_facts(self, messages):  # the contract: needed_facts(self)
        return list(self.task.answer["words"])


class FactsAsText(LedgerEnv):
    def needed_facts(self):
        return " ".join(self.task.answer["words"])  # a str, not a list of str


class FactsNotShown(LedgerEnv):
    def needed_facts(self):
        return [w.upper() for w in self.task.answer["words"]]  # never verbatim on a page


class NoSummary(LedgerEnv):
    demonstrate_summary = AgentEnv.demonstrate_summary  # AgentEnv's: no summaries


class SummaryOneArgument(LedgerEnv):
    def demonstrate_summary(self, messages):
        return "Kept: nothing."


class SummaryAsList(LedgerEnv):
    def demonstrate_summary(self, messages, forced):
        return ["Kept:", *LedgerEnv.demonstrate_summary(self, messages, True).split()[1:]]


class SummaryNoneWhenForced(LedgerEnv):
    def demonstrate_summary(self, messages, forced):
        return None if forced else LedgerEnv.demonstrate_summary(self, messages, False)


CONFIG = """
[model]
path = "assets/ledger-sft"

[rollout]
max_new_tokens = 48
max_turns = 24
max_rollout_tokens = 600

[compaction]
strategy = "tool"
fallback = "drop_oldest"
max_context_tokens = 240
keep_last_turns = 0
max_compactions = 16

[[environments]]
id = "{id}"
name = "book"
kwargs = {{ num_pages = 5, num_facts = 2, filler_words = 40 }}
"""


def check(tmp_path, capsys, cls: str, *extra: str) -> tuple[int, list[str]]:
    """Run check-env on one class of this module under CONFIG; status and error lines."""
    path = tmp_path / "book.toml"
    path.write_text(CONFIG.format(id=f"{HERE}:{cls}"))
    status = main(["check-env", f"{HERE}:{cls}", "--config", str(path),
                   "--num-demonstrations", "4", *extra])
    out = capsys.readouterr().out
    return status, [line for line in out.splitlines() if line.startswith("error: ")]


def test_a_correct_long_trace_environment_passes(tmp_path, capsys):
    status, errors = check(tmp_path, capsys, "CorrectLedger")
    assert (status, errors) == (0, [])


@pytest.mark.parametrize(("cls", "words"), [
    ("FactsWithArgument", ["FactsWithArgument.needed_facts(messages) takes arguments",
                           "needed_facts(self) -> list[str]", "drop the parameters"]),
    ("FactsAsText", ["needed_facts() returned", "(str)", "return a list of non-empty str"]),
    ("FactsNotShown", ["which no observation of the correct scripted episode holds",
                       "exactly as the tools show them"]),
    ("NoSummary", ["compaction.strategy = 'tool'", "has no demonstrate_summary(self, "
                   "messages, forced) -> str | None", "add it"]),
    ("SummaryOneArgument", ["SummaryOneArgument.demonstrate_summary(messages) does not take "
                            "(messages, forced)"]),
    ("SummaryAsList", ["demonstrate_summary(messages, forced=False) returned", "(list)",
                       "or None to act without compacting"]),
    ("SummaryNoneWhenForced", ["demonstrate_summary(messages, forced=True) returned None",
                               "return the summary text (str)"]),
])
def test_a_broken_hook_fails_with_one_line_naming_env_method_and_fix(tmp_path, capsys, cls,
                                                                      words):
    status, errors = check(tmp_path, capsys, cls)
    assert status == 1
    assert len(errors) == 1, errors
    assert errors[0].startswith("error: env 'book': ")
    for word in words:
        assert word in errors[0]


def test_an_episode_that_cannot_fit_the_budget_is_reported_with_its_token_counts(
        tmp_path, capsys):
    """The first prompt fits 170 tokens, a page turn does not: the scripted episode alone
    plays to reward 1, but played as `agentrl sft` plays it every episode is cut short."""
    status, errors = check(tmp_path, capsys, "CorrectLedger",
                           "--set", "compaction.max_context_tokens=170")
    assert status == 1
    assert "4 of 4 scripted episodes were cut short (truncated, context_budget" in errors[0]
    assert "raise compaction.max_context_tokens (now 170)" in errors[0]
    counts = errors[1]
    assert "turn 1 of a scripted episode cannot fit the context" in counts
    assert "over compaction.max_context_tokens = 170" in counts
    found = re.search(r"\((\d+) tokens\) plus .*?\((\d+) tokens\) take (\d+)", counts)
    prompt, turn, total = map(int, found.groups())
    assert prompt + turn == total > 170 > prompt


def test_set_reaches_the_config_without_a_file(capsys):
    """--set alone plays under the defaults plus the override (Ledger needs 10 turns)."""
    status = main(["check-env", "agentrl/Ledger-v0", "--kwargs",
                   '{"num_pages": 4, "filler_words": 4}', "--num-demonstrations", "2",
                   "--set", "rollout.max_turns=3"])
    out = capsys.readouterr().out
    assert status == 1
    assert "truncated, max_turns" in out and "raise rollout.max_turns (now 3)" in out
    assert main(["check-env", "agentrl/Ledger-v0", "--kwargs",
                 '{"num_pages": 4, "filler_words": 4}', "--num-demonstrations", "2",
                 "--set", "rollout.max_turns=8"]) == 0


def test_the_episodes_are_played_under_sfts_strategies(tmp_path, capsys):
    """--strategies splits the episodes over strategies as `agentrl sft --strategies` does:
    Ledger's summaries fit under both, and the summary line names them."""
    path = tmp_path / "book.toml"
    path.write_text(CONFIG.format(id=f"{HERE}:CorrectLedger"))
    assert main(["check-env", f"{HERE}:CorrectLedger", "--config", str(path),
                 "--num-demonstrations", "4", "--strategies", "tool,summarize"]) == 0
    out = capsys.readouterr().out
    assert "(compaction.strategy tool, summarize, " in out and ": 4 played, 4 correct" in out


def test_a_broken_hook_is_named_before_the_warm_start_exists(tmp_path, capsys):
    """With model.path not written yet and `--base new`, check-env fits the tokenizer
    `agentrl sft --base new` would; a hook that breaks every demonstration breaks that
    fitting too, and the hook's own line, not sft's "none of its demonstrations was
    correct", is the error."""
    path = tmp_path / "book.toml"
    path.write_text(CONFIG.format(id=f"{HERE}:FactsWithArgument").replace(
        'path = "assets/ledger-sft"', f'path = "{tmp_path / "runs" / "book-sft"}"'))
    assert main(["check-env", f"{HERE}:FactsWithArgument", "--config", str(path),
                 "--base", "new"]) == 1
    out = capsys.readouterr().out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "needed_facts(messages) takes arguments" in errors[0]
    assert "note: not checked against the budget (`agentrl sft` cannot fit" in out


def test_kwargs_lay_over_the_configs_entry_and_the_summaries_are_counted(tmp_path, capsys):
    """--kwargs checks a longer read of the config's own entry (its name and its other
    kwargs kept), and the summary line says how often the episodes compacted and how many
    of the needed facts the compactions kept."""
    path = tmp_path / "book.toml"
    path.write_text(CONFIG.format(id=f"{HERE}:CorrectLedger"))
    status = main(["check-env", f"{HERE}:CorrectLedger", "--config", str(path),
                   "--num-demonstrations", "4", "--kwargs", '{"num_pages": 9}'])
    out = capsys.readouterr().out
    assert status == 0
    assert re.search(r"^  book  system \d+ \+ tools", out, re.M)  # the config's name
    figures = re.search(r"compactions per episode: (.*?); needed facts kept (\d+) of (\d+)",
                        out)
    assert figures and "1.00 tool" in figures[1] and "drop_oldest" in figures[1]
    assert figures[2] == figures[3] != "0"
    # the page headers of the 9-page read, with the config's 40 filler words a page
    assert "Page 9 of 9." in out and "of 5." not in out


def test_a_read_that_falls_back_less_than_twice_an_episode_gets_a_note(tmp_path, capsys):
    """A training length whose full contexts fall back at most once gets a note (a longer
    read would show the policy contexts it never trained on); 9 pages fall back often."""
    path = tmp_path / "book.toml"
    path.write_text(CONFIG.format(id=f"{HERE}:CorrectLedger"))
    notes = {}
    for pages in (2, 9):
        assert main(["check-env", f"{HERE}:CorrectLedger", "--config", str(path),
                     "--num-demonstrations", "4", "--kwargs", f'{{"num_pages": {pages}}}']) == 0
        out = capsys.readouterr().out
        notes[pages] = [line for line in out.splitlines() if "falls back" in line]
    assert len(notes[2]) == 1 and notes[2][0].startswith("note: a full context falls back "
                                                         "(drop_oldest)")
    assert "compaction.max_context_tokens, now 240" in notes[2][0]
    assert notes[9] == []
    # a truncate fallback ends a longer read rather than compacting it: no note
    main(["check-env", f"{HERE}:CorrectLedger", "--config", str(path), "--num-demonstrations",
          "4", "--kwargs", '{"num_pages": 2}', "--set", 'compaction.fallback="truncate"'])
    assert "falls back" not in capsys.readouterr().out
