"""The suite's own harness (``pyproject.toml``'s addopts, ``tests/conftest.py``), which the other
tests rely on without checking it: run in the test process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("suite")


def test_tests_of_one_xdist_group_go_to_one_worker(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` (the README's test command) pytest-xdist sends the tests of one
    ``xdist_group`` to one worker by the group's name in their ids. pytest 9.2 stopped reading the id
    xdist sets, and every group (the README's blocks, the stale-cgroup tests, Ray's) ran spread over
    the workers without a word."""
    if not request.config.getvalue("loadgroup"):
        pytest.skip("runs under pytest-xdist's --dist loadgroup (the README's test command): groups mean nothing here")
    assert request.node.nodeid.endswith("@suite"), request.node.nodeid
