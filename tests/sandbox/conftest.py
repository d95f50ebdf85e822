"""Fixtures of the sandbox tests."""

import pytest

from tests.sandbox.host import Host


@pytest.fixture(scope="module")
def host():
    """The bait and witnesses of tests/sandbox/host.py, shared by a module's attempts."""
    bait = Host()
    yield bait
    bait.close()
