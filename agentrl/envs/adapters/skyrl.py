"""SkyRL-Gym environments as they are: ``skyrl/<id>`` for every id of ``skyrl_gym``'s
registry (``skyrl/gsm8k_multi_turn``, ``skyrl/text2sql``, ...).

SkyRL-Gym keeps the task out of the environment: its trainer builds one environment per
dataset row, ``skyrl_gym.make(id, env_config=..., extras=row)``, gives the row's
``prompt`` to ``init`` and then calls ``step(text)``, which returns ``observations`` (chat
messages), ``reward``, ``done`` and ``metadata``. This adapter does the same per episode:

- the tasks are the rows of ``dataset`` (a JSONL or Parquet file in SkyRL's format: a
  ``prompt`` list of chat messages, ``reward_spec``, ``extra_info`` and whatever columns the
  environment reads, such as ``db_id``) or of ``tasks`` (the same rows in the config);
  every column but ``prompt`` and ``env_class`` is the environment's ``extras``;
- ``env_config``: the environment's config (an OmegaConf object, as SkyRL passes it), e.g.
  ``{ db_path = "..." }`` for ``text2sql``, over the environment's own config dataclass
  where it has one (SkyRL's defaults fill the fields not given); the rows are checked for
  the fields each environment reads (:data:`ROW_FIELDS`);
- ``reset(seed)`` draws a row (the same seed, the same row), builds the environment and
  returns what ``init`` made of the prompt; held-out rows come from ``eval_dataset``, else
  a stable hash of the prompt puts ``eval_fraction`` of the rows aside, as for every
  agentrl environment;
- ``step`` returns the environment's observations, its reward (a rollout's reward is the
  sum of its step rewards) and ``done`` as ``terminated``; ``truncated`` when ``max_turns``
  steps passed first. SkyRL's ``postprocessed_action`` is not used: agentrl trains the
  tokens the policy generated.

The scripted policy (``check-env``, ``sft``) answers with the row's ``extra_info.answer``
when it has one (SkyRL's GSM8K rows keep the worked solution there), else None.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from agentrl.config.extras import require
from agentrl.envs.agent_env import AgentEnv
from agentrl.envs.task import Task
from agentrl.types import Message

NAMESPACE = "skyrl"
TASK_FIELDS = ("prompt", "env_class")
"""Row columns that are not the environment's ``extras``."""
ROW_FIELDS: dict[str, tuple[str, ...]] = {
    "aime": ("reward_model.ground_truth",),
    "gsm8k": ("reward_spec.ground_truth",),
    "gsm8k_multi_turn": ("reward_spec.ground_truth", "max_turns|extra_info"),
    "lcb": ("reward_spec.ground_truth",),
    "search": ("reward_spec.ground_truth",),
    "searchcode": ("reward_spec.ground_truth",),
    "text2sql": ("db_id", "reward_spec.ground_truth", "data"),
}
"""The row fields each SkyRL-Gym environment reads (from its ``__init__``; "a.b": key b
of column a; "a|b": either), checked when the rows load (docs/ecosystem.md's table)."""


class SkyRLGymEnv(AgentEnv):
    """One SkyRL-Gym environment id over a dataset of rows (see the module doc)."""

    max_turns = 16

    def __init__(self, *, env: str, dataset: str | None = None,
                 tasks: list[dict[str, Any]] | None = None, eval_dataset: str | None = None,
                 env_config: dict[str, Any] | None = None, eval_fraction: float | None = None,
                 **kwargs: Any):
        """``env``: the SkyRL-Gym id; ``dataset`` or ``tasks``: the rows; ``eval_dataset``:
        held-out rows (else ``eval_fraction`` of ``dataset``'s, by hash)."""
        super().__init__(**kwargs)
        self.skyrl = require("skyrl_gym", "a SkyRL-Gym environment")
        if env not in self.skyrl.registry:
            raise ValueError(f"skyrl_gym has no environment {env!r}; it has "
                             f"{', '.join(sorted(self.skyrl.registry))}")
        self.env_id = env
        if (dataset is None) == (tasks is None):
            raise ValueError(f"skyrl/{env}: give the tasks as dataset = 'rows.jsonl' (or "
                             ".parquet) or as tasks = [rows], exactly one of them")
        rows = load_rows(dataset, env) if dataset is not None else check_rows(tasks, env,
                                                                             "tasks")
        self.rows = {"train": rows, "eval": load_rows(eval_dataset, env) if eval_dataset
                     else None}
        if eval_fraction is not None:
            self.eval_fraction = eval_fraction
        self.env_config = full_env_config(self.skyrl, env, env_config or {})
        self.inner: Any = None

    def sample_task(self, rng: np.random.Generator) -> Task:
        """A row of the training rows, drawn with ``rng``."""
        return self._row_task(self.rows["train"], rng)

    def draw_task(self, rng: np.random.Generator, split: str) -> Task:
        """From ``eval_dataset`` when given, else the rows whose prompt hashes into the split."""
        separate = self.rows["eval"]
        if separate is None:
            return super().draw_task(rng, split)
        return self._row_task(self.rows[split] if split == "train" else separate, rng)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Draw a row, build the SkyRL-Gym environment for it and ``init`` its prompt."""
        _, info = super().reset(seed=seed, options=options)
        self._close_inner()
        row = self.task.answer
        extras = {k: v for k, v in row.items() if k not in TASK_FIELDS}
        self.inner = self.skyrl.make(self.env_id, env_config=self.env_config, extras=extras)
        prompt, _ = self.inner.init([dict(m) for m in row["prompt"]])
        messages = to_messages(prompt, "init")
        self.history = list(messages)
        return list(messages), info

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """The SkyRL-Gym environment's step: its observations, reward and ``done``."""
        self.begin_step(action, started=self.inner is not None)
        output = self.inner.step(action)
        observation = to_messages(output.get("observations") or [], "step")
        terminated = bool(output.get("done"))
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        self.history.extend(observation)
        info = {"tool_errors": {}, "reward_components": {}, "num_tool_calls": 0}
        return observation, float(output.get("reward") or 0.0), terminated, truncated, info

    def demonstrate(self, messages: list[Message]) -> str | None:
        """The row's ``extra_info.answer`` (a worked solution), when it has one."""
        extra = (self.task.answer or {}).get("extra_info") if self.task else None
        answer = extra.get("answer") if isinstance(extra, dict) else None
        return answer if isinstance(answer, str) and answer else None

    def close(self) -> None:
        """Close the SkyRL-Gym environment of the current episode."""
        self._close_inner()

    def _close_inner(self) -> None:
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.close()

    @staticmethod
    def _row_task(rows: list[dict[str, Any]], rng: np.random.Generator) -> Task:
        row = rows[int(rng.integers(len(rows)))]
        key = json.dumps(row["prompt"], sort_keys=True, ensure_ascii=False)
        return Task(messages=to_messages(row["prompt"], "prompt"), answer=row, key=key)


def to_messages(conversation: Any, what: str) -> list[Message]:
    """SkyRL's OpenAI-style messages as ``Message``s."""
    if not isinstance(conversation, list):
        raise ValueError(f"the {what} is {type(conversation).__name__}; expected a list of "
                         "chat messages")
    out = []
    for index, item in enumerate(conversation):
        if not (isinstance(item, dict) and isinstance(item.get("content"), str)):
            raise ValueError(f"{what} message {index} is not a chat message with text "
                             f"content: {str(item)[:120]!r}")
        out.append(Message(str(item.get("role", "user")), item["content"]))
    return out


def load_rows(path: str | Path, env: str) -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet dataset in SkyRL's format."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"skyrl/{env}: dataset {path} does not exist (looked at "
                         f"{path.resolve()})")
    if path.suffix == ".parquet":
        rows = require("pyarrow.parquet", "a Parquet dataset").read_table(path).to_pylist()
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return check_rows(rows, env, str(path))


def check_rows(rows: Any, env: str, where: str) -> list[dict[str, Any]]:
    """Rows with a chat ``prompt``, for this environment (``env_class``, when given), each
    with the fields the environment reads (:data:`ROW_FIELDS`)."""
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"skyrl/{env}: {where} holds no rows")
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), list):
            raise ValueError(f"skyrl/{env}: row {index} of {where} has no 'prompt' list of "
                             "chat messages (SkyRL's dataset format)")
        env_class = row.get("env_class")
        if env_class not in (None, env):
            raise ValueError(f"skyrl/{env}: row {index} of {where} is for env_class "
                             f"{env_class!r}")
        for field in ROW_FIELDS.get(env, ()):
            if not any(_has(row, path) for path in field.split("|")):
                raise ValueError(f"skyrl/{env}: row {index} of {where} has no "
                                 f"{' or '.join(field.split('|'))}; skyrl_gym's {env} reads "
                                 f"{', '.join(ROW_FIELDS[env])} (docs/ecosystem.md)")
    return rows


def _has(row: dict[str, Any], path: str) -> bool:
    """Whether the dotted ``path`` ("reward_spec.ground_truth") names a value of ``row``."""
    node: Any = row
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def full_env_config(skyrl: Any, env: str, given: dict[str, Any]) -> Any:
    """``env_config`` as the OmegaConf object SkyRL passes: over the environment's own
    config dataclass (``SearchEnvConfig``...) when its ``__init__`` names one, so every
    field it does not give has SkyRL's default; a field it misspells or that has no
    default is refused in one line naming it."""
    import dataclasses
    import typing

    from skyrl_gym.envs.registration import load_env_creator

    omegaconf = require("omegaconf", "a SkyRL-Gym environment")
    entry = skyrl.registry[env].entry_point
    cls = load_env_creator(entry) if isinstance(entry, str) else entry
    try:
        hint = typing.get_type_hints(cls.__init__).get("env_config")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: no defaults
        hint = None
    schema = next((t for t in (*typing.get_args(hint), hint) if dataclasses.is_dataclass(t)),
                  None)
    if schema is None:
        return omegaconf.OmegaConf.create(given)
    fields = ", ".join(f.name for f in dataclasses.fields(schema))
    try:
        config = omegaconf.OmegaConf.merge(omegaconf.OmegaConf.structured(schema), given)
    except omegaconf.errors.OmegaConfBaseException as exc:
        raise ValueError(f"skyrl/{env}: env_config: {str(exc).splitlines()[0]} "
                         f"({schema.__name__} has {fields})") from None
    missing = sorted(omegaconf.OmegaConf.missing_keys(config))
    if missing:
        raise ValueError(f"skyrl/{env}: env_config needs {', '.join(missing)} (no default "
                         f"in {schema.__name__}, which has {fields})")
    return config


def register(name: str) -> None:
    """Register ``skyrl/NAME`` for the SkyRL-Gym id NAME (ValueError: no such id)."""
    skyrl = require("skyrl_gym", f"skyrl/{name}")
    if name not in skyrl.registry:
        raise ValueError(f"skyrl/{name}: skyrl_gym has no environment {name!r}; it has "
                         f"{', '.join(sorted(skyrl.registry))}")
    gymnasium.register(f"{NAMESPACE}/{name}", entry_point=f"{__name__}:SkyRLGymEnv",
                       kwargs={"env": name}, disable_env_checker=True, order_enforce=False)
