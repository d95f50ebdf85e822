"""Environment ids: the built-ins, plugins of installed packages, and import paths.

An environment in a config (``[[environments]] id = ...``) is one of:

- a registered id, e.g. ``"agentrl/Countdown-v0"``;
- ``"path/to/file.py:ClassName"`` (a file, relative to where ``agentrl`` runs or, in a
  config, to the config's folder) or ``"package.module:ClassName"``: no registration
  needed;
- an id an installed package declares in its ``pyproject.toml`` under the
  ``gymnasium.envs`` entry-point group, the plugin convention of Gymnasium 0.26-0.29,
  loaded here because Gymnasium 1.x no longer reads it. Two forms are accepted::

      [project.entry-points."gymnasium.envs"]
      "myproject/LogSearch-v0" = "myproject.logsearch:LogSearchEnv"  # an id: the class
      myproject = "myproject.envs:register_all"  # a function that calls gymnasium.register

  The first form needs no Python code and imports nothing until the id is made; the
  second is called under the namespace of its name, as Gymnasium 0.26-0.29 did.

agentrl's own built-ins are registered through that same entry point (``agentrl =
"agentrl.envs.registry:register_builtins"``), and directly as a fallback for a source checkout
that was never installed. ``import agentrl`` runs :func:`register_all`, after which
``gymnasium.make("agentrl/Countdown-v0")`` works; with Gymnasium's module prefix,
``gymnasium.make("agentrl:agentrl/Countdown-v0")`` works without importing agentrl first.

:func:`make` returns the bare :class:`agentrl.envs.agent_env.AgentEnv` (no Gymnasium wrappers),
because the runner calls its own methods (``astep``, ``tool_schemas``) that wrappers do
not forward.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Any

import gymnasium
from gymnasium.envs.registration import namespace

from agentrl.envs.agent_env import AgentEnv, missing_init_message

BUILTINS = {
    "agentrl/Countdown-v0": "environments.countdown:CountdownEnv",
    "agentrl/GSM8K-v0": "environments.gsm8k:GSM8KEnv",
    "agentrl/Calculator-v0": "environments.calculator:CalculatorEnv",
    "agentrl/KVStore-v0": "environments.kvstore:KVStoreEnv",
    "agentrl/Python-v0": "environments.python:PythonEnv",
    "agentrl/Ledger-v0": "environments.ledger:LedgerEnv",
    "agentrl/DocQA-v0": "environments.docqa:DocQAEnv",
    "agentrl/Drill-v0": "agentrl.curriculum.drills:DrillEnv",
}
"""Built-in ids and their entry points (Ledger and KVStore are the long-horizon ones: in
Ledger facts must survive compaction, in KVStore only the last turn matters; DocQA is the
one solved by delegating to subagents)."""

OPENENV_ID = "agentrl/OpenEnv-v0"
ADAPTERS = {OPENENV_ID: "agentrl.envs.adapters.openenv_env:OpenEnvEnv"}
"""Environments served elsewhere, by keyword (``url``, ``command`` or ``package``)."""

NAMESPACES = {
    "openenv": "agentrl.envs.adapters.openenv_env",
    "skyrl": "agentrl.envs.adapters.skyrl",
}
"""Id namespaces whose ids are registered on first use by the module's ``register(name)``:
``openenv/NAME`` (an installed OpenEnv environment package), ``skyrl/NAME`` (a SkyRL-Gym
environment id). Their packages are imported only then."""


def register_builtins() -> None:
    """Register every built-in and adapter id once (idempotent)."""
    for env_id, entry_point in {**BUILTINS, **ADAPTERS}.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point, disable_env_checker=True,
                               order_enforce=False)


def register_namespace_id(env_id: str) -> None:
    """Register an ``openenv/...`` or ``skyrl/...`` id through its adapter; ValueError
    when it is unknown there or its optional package is missing (one line, the fix)."""
    from agentrl.config.extras import MissingExtra

    namespace_name, _, name = env_id.partition("/")
    if namespace_name in NAMESPACES and name and env_id not in gymnasium.registry:
        try:
            importlib.import_module(NAMESPACES[namespace_name]).register(name)
        except MissingExtra as exc:
            raise ValueError(f"{env_id!r}: {exc}") from None


PLUGIN_GROUP = "gymnasium.envs"
"""The entry-point group installed packages declare environments under."""
_ENV_ID = re.compile(r"[\w:.-]+/[\w:.-]+-v\d+")
_plugins_loaded = False


def load_plugins() -> None:
    """Register the environments installed packages declare under ``gymnasium.envs``
    (once per process); a plugin that fails warns, naming it, and the rest still load."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            if _ENV_ID.fullmatch(entry.name):  # "ns/Name-v0" = "module:Class"
                if entry.name not in gymnasium.registry:
                    gymnasium.register(entry.name, entry_point=entry.value,
                                       disable_env_checker=True, order_enforce=False)
                continue
            target = entry.load()
            if callable(target):  # a registering function, under its namespace
                with namespace(entry.name):
                    target()
        except Exception as exc:  # a broken plugin must not break agentrl
            warnings.warn(f"{PLUGIN_GROUP} plugin {entry.name} = {entry.value} failed to "
                          f"register: {type(exc).__name__}: {exc}", stacklevel=2)


def register_all() -> None:
    """Plugins of installed packages (agentrl's built-ins among them), then the built-ins
    directly in case agentrl runs from a checkout that was never installed."""
    load_plugins()
    register_builtins()


def registered_ids() -> list[str]:
    """Every agentrl environment id known to Gymnasium."""
    return sorted(i for i in gymnasium.registry if i.startswith("agentrl/"))


def resolve(id_or_path: str) -> type[AgentEnv] | str:
    """The registered id itself, or the class named by "package.module:Class" / "file.py:Class"."""
    register_all()
    register_namespace_id(id_or_path)
    if id_or_path in gymnasium.registry:
        return id_or_path
    if ":" not in id_or_path:
        close = difflib.get_close_matches(id_or_path, registered_ids(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"unknown environment {id_or_path!r}; {hint}registered: "
            f"{', '.join(registered_ids())}; skyrl/NAME (a SkyRL-Gym environment) or "
            "openenv/NAME (an installed OpenEnv environment); or an import path like "
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
        if isinstance(target, str) and (direct := _agent_env_entry(target)) is not None:
            cls, registered = direct  # gymnasium.make's spec look-up and wrappers, unwrapped
            env = cls(**{**registered, **kwargs})  # again, at every rollout: skipped
        elif isinstance(target, str):
            env = gymnasium.make(target, disable_env_checker=True, **kwargs).unwrapped
        else:
            env = target(**kwargs)
    except TypeError as exc:  # almost always a misspelled constructor keyword
        raise ValueError(f"cannot build {id_or_path!r} with kwargs {kwargs}: {exc}") from None
    if isinstance(env, AgentEnv) and "action_space" not in vars(env):
        raise ValueError(missing_init_message(type(env)))
    return env  # type: ignore[return-value]


@functools.cache
def _agent_env_entry(env_id: str) -> tuple[type[AgentEnv], dict[str, Any]] | None:
    """The AgentEnv class a registered id builds and its registered kwargs (None when its
    entry point is anything else: those go through ``gymnasium.make``)."""
    spec = gymnasium.spec(env_id)
    entry = spec.entry_point
    try:
        creator = gymnasium.envs.registration.load_env_creator(entry) if isinstance(
            entry, str) else entry
    except Exception:  # noqa: BLE001 - gymnasium.make reports it as it always has
        return None
    if isinstance(creator, type) and issubclass(creator, AgentEnv):
        return creator, dict(spec.kwargs)
    return None


def load_object(path: str, what: str) -> Any:
    """The object ``"package.module:name"`` or ``"file.py:name"`` names (``what``: the
    setting it came from, for errors)."""
    module_name, _, name = path.rpartition(":")
    if not module_name or not name:
        raise ValueError(f"{what} = {path!r}: give 'package.module:name' or 'file.py:name'")
    target = getattr(_import(module_name, path), name, None)
    if target is None:
        raise ValueError(f"{what} = {path!r}: {module_name} has no {name!r}")
    return target


_FILE_IMPORT_LOCK = threading.RLock()


def _import(module_name: str, id_or_path: str) -> Any:
    """The module a "file.py" or "package.module" part of an import path names; an import
    that fails is one ValueError line naming the file (or module) and what was missing."""
    if module_name.endswith(".py"):
        return _import_file(Path(module_name), id_or_path)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{id_or_path!r}: cannot import {module_name} ({exc})") from None


def _import_file(path: Path, id_or_path: str) -> Any:
    """Import a user's file once per process, with its folder importable first (as Python
    runs a script: ``from mylib import x`` finds ``mylib.py`` beside it)."""
    if not path.exists():
        raise ValueError(f"{id_or_path!r}: file {path} does not exist")
    key = "agentrl_user_env_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    with _FILE_IMPORT_LOCK:  # rollouts build instances on many threads at once
        if key in sys.modules:  # make() runs once per rollout: import the file once
            return sys.modules[key]
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # the lock: no other thread sees it half-imported
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            del sys.modules[key]
            raise ValueError(import_failure(path, exc)) from None
        except BaseException:
            del sys.modules[key]
            raise
        return module


def import_failure(path: Path, exc: ImportError) -> str:
    """One line: the file, the line of it whose import failed, the missing module, the fix."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__)
             if Path(frame.filename).resolve() == path.resolve()]
    where = f"{path}, line {lines[-1]}" if lines else str(path)
    missing = f"module {exc.name!r}" if exc.name else "a name"
    return (f"{where}: cannot import {missing} ({type(exc).__name__}: {exc}); install it, "
            f"or put it beside {path.name} (its folder is importable)")

register_all()
