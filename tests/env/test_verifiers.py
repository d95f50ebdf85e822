"""Each built-in verifier on hand-written right, wrong and malformed answers."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from agentrl.envs.registry import make
from environments._verify import extract_number
from environments.countdown import check_expression, extract_expression
from environments.gsm8k import SAMPLE_PATH, gold_answer, load_records
from environments.kvstore import scripted_action


@pytest.mark.parametrize("expression, ok", [
    ("(25 - 5) * 4 + 3", False),  # 83, and 3 is not a given number
    ("(25 - 5) * 4", True),
    ("4 * (25 - 5)", True),
    ("(25 - 5) * 4 = 80", True),  # a trailing "= result" is ignored
    ("25 * 4 - 5", False),  # 95
    ("(25 - 5) * 4 * 1", False),  # 1 is not a given number
    ("(25 - 25) * 4", False),  # reuses 25, misses 5
    ("25 * 4", False),  # misses 5
    ("4 * (25 - 5) / (5 - 5)", False),  # division by zero
    ("__import__('os').system('true')", False),  # code injection: a Call node
    ("-(5 - 25) * 4", False),  # unary minus is not allowed
    ("(25 - 5) ** 4", False),  # power is not allowed
    ("(" * 400 + "1" + ")" * 400, False),  # too long / too deep
    ("", False),
])
def test_countdown_expressions(expression, ok):
    assert check_expression(expression, [25, 5, 4], 80)[0] is ok


def test_countdown_division_and_extraction():
    assert check_expression("(6 / 4) * 2", [6, 4, 2], 3)[0]  # exact fractions
    assert extract_expression("thinking...\n<answer>1+2</answer>\nbye") == "1+2"
    assert extract_expression("I think\n(1 + 2) * 3\n") == "(1 + 2) * 3"


def test_countdown_env_rewards_right_answer_only():
    env = make("agentrl/Countdown-v0", num_numbers=2, max_number=9)
    env.reset(seed=3)
    a, b = env.task.answer["numbers"]
    target = env.task.answer["target"]
    right = next(e for e in (f"{a}+{b}", f"{a}*{b}", f"{a}-{b}", f"{b}-{a}", f"{a}/{b}",
                             f"{b}/{a}") if check_expression(e, [a, b], target)[0])
    assert env.step(f"<answer>{right}</answer>")[1] == 1.0
    env.reset(seed=3)
    assert env.step(f"<answer>{a}</answer>")[1] == 0.0


@pytest.mark.parametrize("text, value", [
    ("The answer is 42.", 42),
    ("#### 1,234", 1234),
    ("so she pays $1,200.50 in total", Fraction("1200.50")),
    ("\\boxed{17} apples", 17),
    ("It takes 15 km", 15),
    ("<answer>-3</answer>", -3),
    ("3 + 4 = 7", 7),
    ("25%", 25),
])
def test_gsm8k_number_extraction(text, value):
    assert extract_number(text) == value


def test_gsm8k_env_on_sample_file(tmp_path):
    env = make("agentrl/GSM8K-v0")
    env.reset(seed=0)
    gold = env.task.answer
    assert env.step(f"Step by step... so the answer is ${int(gold):,}.")[1] == 1.0
    env.reset(seed=0)
    assert env.step(f"#### {int(gold) + 1}")[1] == 0.0
    env.reset(seed=0)
    assert env.step("I do not know")[4]["reward_components"]["formatted"] == 0.0
    records = load_records(SAMPLE_PATH)
    assert len(records) == 20 and gold_answer("x\n#### 1,000") == 1000
    eval_questions = {r["question"] for r in env.splits["eval"]}
    assert len(eval_questions) == 2 and not eval_questions & {
        r["question"] for r in env.splits["train"]}


def test_gsm8k_reads_parquet_as_it_reads_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = load_records(SAMPLE_PATH)
    path = tmp_path / "sample.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    assert load_records(path) == records
    from_jsonl, from_parquet = make("agentrl/GSM8K-v0"), make("agentrl/GSM8K-v0", path=str(path))
    from_jsonl.reset(seed=3)
    from_parquet.reset(seed=3)
    assert from_parquet.task.answer == from_jsonl.task.answer
    assert from_parquet.step(f"#### {int(from_jsonl.task.answer)}")[1] == 1.0


def test_gsm8k_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        make("agentrl/GSM8K-v0", path=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"q": "x"}) + "\n")
    with pytest.raises(ValueError, match="'question' and 'answer'"):
        make("agentrl/GSM8K-v0", path=str(bad))


def test_calculator_tool_and_answer():
    env = make("agentrl/Calculator-v0")
    env.reset(seed=5)
    assert env.calculate("(3 + 4) * 2") == "14"
    assert env.calculate("7 / 2") == "3.5"
    with pytest.raises(ValueError):
        env.calculate("__import__('os')")
    call = json.dumps({"name": "calculate", "arguments": {"expression": "2 * 3"}})
    obs, *_ = env.step(f"<tool_call>{call}</tool_call>")
    assert obs[0].content == "6" and obs[0].name == "calculate"
    _, reward, terminated, _, info = env.step(f"The answer is {env.task.answer}.")
    assert (reward, terminated) == (1.0, True)
    assert info["reward_components"] == {"correct": 1.0, "used_calculator": 1.0}
    env.reset(seed=5)
    assert env.step(f"{env.task.answer + 1}")[1] == 0.0


@pytest.mark.parametrize(("reply", "strict", "lenient"), [
    ("{a}", 1.0, 1.0), ("{a}.", 1.0, 1.0), (" <answer> {a} </answer>\n", 1.0, 1.0),
    ("The answer is {a}.", 1.0, 1.0), ("{b}", 0.0, 0.0),
    # garbage that merely ends in the right number: a broken call, a rambling reply
    ('<tool_call\n{{"name2 {a}', 0.0, 1.0), ("maybe {b} or {a}", 0.0, 1.0),
])
def test_calculator_strict_answers_refuse_buried_numbers(reply, strict, lenient):
    for strict_answer, expected in ((True, strict), (False, lenient)):
        env = make("agentrl/Calculator-v0", strict_answer=strict_answer)
        env.reset(seed=5)
        a, b = env.task.answer, env.task.answer + 1
        assert env.step(reply.format(a=a, b=b))[1] == expected, (reply, strict_answer)


def test_kvstore_scripted_policy_solves_it_with_one_call_per_key():
    env = make("agentrl/KVStore-v0", chain_length=5, padding_words=3)
    messages, _ = env.reset(seed=2)
    history, total, steps = list(messages), 0.0, 0
    while True:
        obs, reward, terminated, truncated, _ = env.step(scripted_action(history))
        history += obs
        total, steps = total + reward, steps + 1
        if terminated or truncated:
            break
    assert (total, steps, terminated) == (1.0, 6, True)
    env.reset(seed=2)
    assert env.step("<answer>0</answer>")[1] == 0.0


def test_kvstore_scripted_policy_needs_only_the_latest_clue():
    env = make("agentrl/KVStore-v0", chain_length=3, padding_words=0)
    messages, _ = env.reset(seed=4)
    obs = env.step(scripted_action(messages))[0]
    # a compacted context: the task message dropped, only the last observation kept
    obs = env.step(scripted_action(obs))[0]
    obs = env.step(scripted_action(obs))[0]
    assert env.step(scripted_action(obs))[1] == 1.0


def test_python_env_grades_and_runs_code():
    env = make("agentrl/Python-v0", max_n=30, cpu_s=2, wall_s=5)
    env.reset(seed=1)
    call = json.dumps({"name": "run_python", "arguments": {"code": "print(6 * 7)"}})
    obs = env.step(f"<tool_call>{call}</tool_call>")[0]
    assert obs[0].content == "42"
    assert env.step(f"<answer>{env.task.answer}</answer>")[1] == 1.0
