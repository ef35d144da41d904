"""The public face: ``jailbox.__all__`` is exactly the documented names, each resolves, and nothing
else public hangs off the package (in the style of httpx's test of the same name)."""

from __future__ import annotations

import types

import pytest

import jailbox
import jailbox.sandbox
import jailbox.sandbox.serving

pytestmark = pytest.mark.once  # the public names are the same whoever runs it

PUBLIC = [
    "AsyncSandbox",
    "ExecResult",
    "Limits",
    "Mount",
    "NetworkPolicy",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "SeccompPolicy",
    "Secret",
    "Snapshot",
]


def test_all_is_exactly_the_public_names():
    assert jailbox.__all__ == PUBLIC


def test_every_exported_name_resolves_to_a_class_of_the_package():
    for name in jailbox.__all__:
        value = getattr(jailbox, name)
        assert isinstance(value, type), name
        assert value.__name__ == name
        assert value.__module__.startswith("jailbox.sandbox."), (name, value.__module__)
        assert getattr(jailbox.sandbox, name) is value  # one object, whichever door it is taken from


def test_every_public_name_is_exported():
    public = [
        member
        for member in dir(jailbox)
        if not member.startswith("_") and not isinstance(getattr(jailbox, member), types.ModuleType)
    ]
    assert sorted(public, key=str.casefold) == sorted(jailbox.__all__, key=str.casefold)


def test_the_snapshots_module_is_the_one_module_beside_them():
    from jailbox import snapshots

    assert snapshots is jailbox.sandbox.snapshots and "snapshots" in dir(jailbox)


def test_an_unknown_name_is_an_attribute_error():
    try:
        jailbox.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("jailbox.NoSuchThing resolved")


SERVING = [
    "NETWORK_RULES_MAX",
    "NETWORK_RULE_MAX",
    "SNAPSHOT_ID",
    "SNAPSHOT_NAME",
    "Checkpoint",
    "ExecRun",
    "IPNetwork",
    "Ports",
    "Rules",
    "Store",
    "TtyCommand",
    "check_env",
    "first_error",
    "jail_path",
    "lan_networks",
    "normalize_host",
    "run_sync",
    "start_ticks",
    "state_dir",
    "stored",
]


def test_the_servers_internal_surface_is_exactly_its_list():
    """``jailbox.sandbox.serving``: what ``jailbox.servers`` may use beyond the public face. A new name
    there is a decision, made here and in its docstring."""
    assert jailbox.sandbox.serving.__all__ == SERVING
    public = [m for m in vars(jailbox.sandbox.serving) if not m.startswith("_") and m != "annotations"]
    assert sorted(public) == sorted(SERVING)
