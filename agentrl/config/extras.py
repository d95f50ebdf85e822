"""Optional dependencies: each is imported where it is used, never at ``import agentrl``.

:func:`require` imports one and, when it is missing, raises an ImportError of one line
naming the ``pip install`` that brings it (the extras are declared in pyproject.toml).
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {
    "openenv": "openenv",
    "skyrl_gym": "skyrl",
    "omegaconf": "skyrl",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "pyarrow": "parquet",
}
"""Module -> the agentrl extra that installs it."""


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the install command."""


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` (e.g. "openenv.core"); ``what`` names the feature that needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        if exc.name is not None and exc.name.split(".")[0] != top:
            raise  # the package is there but one of its own imports failed: show that
        extra = EXTRAS.get(top, top)
        raise MissingExtra(f"{what} needs the {top} package, which is not installed: "
                           f"pip install 'agentrl[{extra}]'") from None
