"""Registration of the built-in environments and ``make`` for ids or import paths.

Importing this module registers every built-in with ``gymnasium.register``, so
``gymnasium.make("agentrl/Countdown-v0")`` works too. :func:`make` returns the bare
:class:`agentrl.env.AgentEnv` (no Gymnasium wrappers), because the runner calls its own
methods (``astep``, ``tool_schemas``) that wrappers do not forward.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import gymnasium

from agentrl.env import AgentEnv

BUILTINS = {
    "agentrl/Countdown-v0": "environments.countdown:CountdownEnv",
    "agentrl/GSM8K-v0": "environments.gsm8k:GSM8KEnv",
    "agentrl/Calculator-v0": "environments.calculator:CalculatorEnv",
    "agentrl/KVStore-v0": "environments.kvstore:KVStoreEnv",
    "agentrl/Python-v0": "environments.python:PythonEnv",
}
"""Built-in ids and their entry points (KVStore is the long-horizon environment)."""


def register_builtins() -> None:
    """Register every built-in id once (idempotent)."""
    for env_id, entry_point in BUILTINS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point, disable_env_checker=True,
                               order_enforce=False)


def registered_ids() -> list[str]:
    """Every agentrl environment id known to Gymnasium."""
    return sorted(i for i in gymnasium.registry if i.startswith("agentrl/"))


def resolve(id_or_path: str) -> type[AgentEnv] | str:
    """The registered id itself, or the class named by "package.module:Class" / "file.py:Class"."""
    register_builtins()
    if id_or_path in gymnasium.registry:
        return id_or_path
    if ":" not in id_or_path:
        close = difflib.get_close_matches(id_or_path, registered_ids(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"unknown environment {id_or_path!r}; {hint}registered: "
            f"{', '.join(registered_ids())}; or give an import path like "
            "'package.module:ClassName'"
        )
    module_name, _, class_name = id_or_path.rpartition(":")
    module = _import(module_name, id_or_path)
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, AgentEnv)):
        raise ValueError(f"{id_or_path!r}: {module_name} has no AgentEnv subclass {class_name!r}")
    return cls


def make(id_or_path: str, **kwargs: Any) -> AgentEnv:
    """Build an environment from a registered id or an import path, with constructor kwargs."""
    target = resolve(id_or_path)
    try:
        if isinstance(target, str):
            env = gymnasium.make(target, disable_env_checker=True, **kwargs)
            return env.unwrapped  # type: ignore[return-value]
        return target(**kwargs)
    except TypeError as exc:  # almost always a misspelled constructor keyword
        raise ValueError(f"cannot build {id_or_path!r} with kwargs {kwargs}: {exc}") from None


def _import(module_name: str, id_or_path: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.exists():
            raise ValueError(f"{id_or_path!r}: file {path} does not exist")
        key = "agentrl_user_env_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        if key in sys.modules:  # make() runs once per rollout: import the file once
            return sys.modules[key]
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{id_or_path!r}: cannot import {module_name} ({exc})") from None


register_builtins()
