"""Each optional package (openenv, skyrl-gym, wandb, mlflow) is imported only where used,
and a missing one is one line naming the ``pip install``; checked in fresh interpreters
where the package is made unimportable, installed or not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def without(packages: list[str], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with ``packages`` unimportable (as if not installed)."""
    hide = "".join(f"sys.modules[{p!r}] = None\n" for p in packages)
    script = f"import sys\n{hide}{textwrap.dedent(code)}"
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_importing_agentrl_imports_no_optional_package():
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        import agentrl, agentrl.cli, agentrl.train.run, agentrl.commands.check_env
        import agentrl.commands.serve_env, agentrl.rollout.env_guard
        heavy = [m for m in ("openenv", "skyrl_gym", "wandb", "mlflow") if m in sys.modules]
        print(heavy)
    """)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize("packages, code, words", [
    (["skyrl_gym"], "from agentrl.envs.registry import make\nmake('skyrl/gsm8k', tasks=[])",
     "needs the skyrl_gym package, which is not installed: pip install 'agentrl[skyrl]'"),
    (["openenv", "openenv.core"],
     "from agentrl.envs.registry import make\nmake('agentrl/OpenEnv-v0', url='http://x')",
     "needs the openenv package, which is not installed: pip install 'agentrl[openenv]'"),
    (["wandb"], "from agentrl.config import WandbConfig\n"
                "from agentrl.observe.wandb_writer import WandbWriter\n"
                "WandbWriter(WandbConfig(project='p'), '.', {})",
     "log.wandb needs the wandb package, which is not installed: pip install 'agentrl[wandb]'"),
    (["mlflow", "mlflow.tracking"], "from agentrl.config import MlflowConfig\n"
                                    "from agentrl.observe.mlflow_writer import MlflowWriter\n"
                                    "MlflowWriter(MlflowConfig(), '.', {})",
     "log.mlflow needs the mlflow package, which is not installed: pip install "
     "'agentrl[mlflow]'"),
])
def test_a_missing_package_is_one_line(packages, code, words):
    done = without(packages, code)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith(words), done.stderr


def test_commands_say_it_in_one_line():
    done = without(["openenv", "openenv.core", "openenv.core.env_server.types"], """
        from agentrl.cli import main
        sys.exit(main(["serve-env", "agentrl/Countdown-v0", "--port", "0"]))
    """)
    assert done.returncode == 2
    assert done.stdout.strip() == ("error: agentrl serve-env needs the openenv package, which "
                                   "is not installed: pip install 'agentrl[openenv]'")
    done = without(["skyrl_gym"], """
        from agentrl.cli import main
        sys.exit(main(["check-env", "skyrl/gsm8k_multi_turn"]))
    """)
    assert done.returncode == 2 and "pip install 'agentrl[skyrl]'" in done.stdout
