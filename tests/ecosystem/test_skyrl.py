"""SkyRL-Gym environments as they are, through ``skyrl/<id>``: the real package's GSM8K
multi-turn and text-to-SQL environments give the rewards they give when played
directly, pass ``check-env`` and train for a step."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
import skyrl_gym
from omegaconf import OmegaConf

from agentrl.cli import main
from agentrl.envs.registry import make
from agentrl.observe.writers import read_metrics
from agentrl.types import Message
from tests.ecosystem.tiny import TINY_BATCH

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT / "examples" / "ecosystem" / "gsm8k_skyrl.jsonl"
GOLD_SQL = "SELECT name FROM items WHERE price > 2"
SQL_ACTIONS = [f"<think>which items cost more than 2?</think><sql>{GOLD_SQL}</sql>",
               f"<think>the query answers it</think><solution>{GOLD_SQL}</solution>"]


@pytest.fixture(scope="module")
def sql_task(tmp_path_factory) -> dict:
    """A one-table database in the layout SkyRL's text2sql expects, and a task row."""
    root = tmp_path_factory.mktemp("sql")
    db = root / "spider" / "database" / "shop" / "shop.sqlite"
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE items (name TEXT, price REAL)")
        conn.executemany("INSERT INTO items VALUES (?, ?)",
                         [("pen", 1.5), ("book", 12.0), ("lamp", 30.0)])
    row = {"prompt": [{"role": "user", "content": "Table items(name, price). Which items "
                       "cost more than 2? Think in <think>, query with <sql>, answer in "
                       "<solution>."}],
           "env_class": "text2sql", "db_id": "shop", "data": "spider",
           "reward_spec": {"method": "rule", "ground_truth": GOLD_SQL},
           "extra_info": {}}
    return {"env_config": {"db_path": str(root)}, "tasks": [row]}


def test_gsm8k_multi_turn_rewards_are_the_packages(tmp_path):
    actions = ["let me think", "#### 1", "#### 36"]
    env = make("skyrl/gsm8k_multi_turn", dataset=str(GSM8K), eval_fraction=0.2)
    messages, _ = env.reset(seed=0)
    row = env.task.answer
    direct = skyrl_gym.make("gsm8k_multi_turn", env_config=OmegaConf.create({}),
                            extras={k: v for k, v in row.items() if k != "prompt"})
    prompt, _ = direct.init(row["prompt"])
    assert [(m.role, m.content) for m in messages] == [(m["role"], m["content"]) for m in prompt]
    actions[-1] = f"#### {row['reward_spec']['ground_truth']}"
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        expected = direct.step(action)
        assert reward == expected["reward"] and terminated == expected["done"]
        assert observation == [Message(m["role"], m["content"]) for m in expected["observations"]]
    assert terminated and reward == 1.0  # 0.2/3 for a formatted wrong answer before
    env.close()


def test_held_out_rows_and_bad_rows(tmp_path):
    env = make("skyrl/gsm8k_multi_turn", dataset=str(GSM8K), eval_fraction=0.2)
    train = {env.reset(seed=s)[0][-1].content for s in range(40)}
    held = {env.reset(seed=s, options={"split": "eval"})[0][-1].content for s in range(40)}
    assert held and train and not held & train
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "no prompt"}) + "\n")
    with pytest.raises(ValueError, match="row 0 of .* has no 'prompt'"):
        make("skyrl/gsm8k_multi_turn", dataset=str(bad))
    with pytest.raises(ValueError, match="skyrl_gym has no environment 'nope'"):
        make("skyrl/nope", tasks=[])


def test_check_env_on_gsm8k_multi_turn(capsys):
    kwargs = json.dumps({"dataset": str(GSM8K), "eval_fraction": 0.2})
    assert main(["check-env", "skyrl/gsm8k_multi_turn", "--kwargs", kwargs,
                 "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("terminated; reward 1") == 3  # the rows' worked solutions
    assert "gymnasium check_env: passed" in out


def test_check_env_on_text2sql(sql_task, tmp_path, capsys):
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps(SQL_ACTIONS))
    kwargs = json.dumps({**sql_task, "eval_fraction": 0.01})
    assert main(["check-env", "skyrl/text2sql", "--kwargs", kwargs, "--actions",
                 str(actions)]) == 0
    out = capsys.readouterr().out
    assert "book" in out and "lamp" in out  # the <sql> tool's result
    assert "terminated; reward 1" in out
    assert "gymnasium check_env: passed" in out


TRAIN = TINY_BATCH + """
[rollout]
max_new_tokens = 16
max_turns = 3
[train]
num_steps = 1
[log]
live = false
[[environments]]
id = "skyrl/gsm8k_multi_turn"
kwargs = {{ dataset = "{gsm8k}", eval_fraction = 0.2 }}
[[environments]]
id = "skyrl/text2sql"
kwargs = {{ tasks = {tasks}, env_config = {{ db_path = "{db_path}" }}, eval_fraction = 0.01 }}
"""


@pytest.mark.slow
def test_a_training_step_on_both(sql_task, tmp_path):
    config = tmp_path / "skyrl.toml"
    config.write_text(TRAIN.format(gsm8k=GSM8K, tasks=_toml(sql_task["tasks"]),
                                   db_path=sql_task["env_config"]["db_path"]))
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 0
    [metrics] = [m for m in read_metrics(tmp_path / "run") if m["step"] == 1]
    assert metrics["env/gsm8k_multi_turn/num_rollouts"] == 2
    assert metrics["env/text2sql/num_rollouts"] == 2
    assert metrics["num_invalid_rollouts"] == 0


def _toml(value) -> str:
    """A value as a TOML inline value (for the rows written into the config)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


SEARCH_ROW = {"prompt": [{"role": "user", "content": "Who wrote Hamlet?"}],
              "reward_spec": {"ground_truth": {"target": ["Shakespeare"]}}}


def test_search_fills_skyrls_own_config_defaults():
    """Two of SearchEnvConfig's four fields given: the other two are SkyRL's defaults."""
    env = make("skyrl/search", tasks=[SEARCH_ROW],
               env_config={"search_url": "http://127.0.0.1:9/retrieve", "topk": 2})
    env.reset(seed=0)
    assert dict(env.env_config) == {"log_requests": False, "topk": 2, "timeout": 30,
                                    "search_url": "http://127.0.0.1:9/retrieve"}
    assert env.inner.tool_group is not None
    env.close()


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"env": "search", "env_config": {"serch_url": "x"}}, "'serch_url' not in 'SearchEnvConfig'"),
    ({"env": "aime"}, "row 0 of tasks has no reward_model.ground_truth"),
    ({"env": "text2sql"}, "row 0 of tasks has no db_id"),
])
def test_a_missing_or_misspelled_field_is_one_line_naming_it(kwargs, words):
    with pytest.raises(ValueError) as info:
        make(f"skyrl/{kwargs['env']}", tasks=[SEARCH_ROW], env_config=kwargs.get("env_config"))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_page_says_which_rows_each_environment_reads():
    from agentrl.envs.adapters.skyrl import ROW_FIELDS

    page = (ROOT / "docs" / "ecosystem.md").read_text()
    table = dict(re.findall(r"^\| `skyrl/(\w+)` \| ([^|]+) \|", page, re.M))
    assert set(ROW_FIELDS) == set(skyrl_gym.registry) == set(table)  # a new one: add it
    for env, fields in ROW_FIELDS.items():
        assert re.findall(r"`([^`]+)`", table[env]) == [f.replace("|", " or ") for f in fields]
