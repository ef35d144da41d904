"""The attack battery, the state directory: it holds what becomes every jail's /etc and writable
layers, so one that another user owns or may write in is refused, never used (and never chmod-ed)."""

from __future__ import annotations

import os
import stat

import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.errors import ConfigError


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o702])
def test_a_state_directory_others_may_write_in_is_refused(tmp_path, monkeypatch, mode):
    shared = tmp_path / "shared-state"
    shared.mkdir()
    os.chmod(shared, mode)
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(shared))
    with pytest.raises(ConfigError, match=r"writable by other users .*chmod go-w .*JAILBOX_STATE_DIR"):
        Sandbox()
    assert stat.S_IMODE(shared.stat().st_mode) == mode and os.listdir(shared) == []


def test_a_state_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
    else:
        theirs = tmp_path  # the nearest directory above that is not ours (/tmp, root's)
        while theirs.stat().st_uid == os.getuid():
            theirs = theirs.parent
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(theirs))
    with pytest.raises(ConfigError, match=rf"belongs to uid {theirs.stat().st_uid}, not to you"):
        Sandbox()


def test_a_link_to_a_state_directory_is_judged_by_its_target(tmp_path, monkeypatch):
    """The link is this user's own; what it names is another user's directory (refused for its
    owner), or this user's but open to all (refused for its mode)."""
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
    else:
        theirs = tmp_path  # the nearest directory above that is not ours (/tmp, root's)
        while theirs.stat().st_uid == os.getuid():
            theirs = theirs.parent
    (tmp_path / "to-theirs").symlink_to(theirs)
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(tmp_path / "to-theirs"))
    with pytest.raises(ConfigError, match=rf"belongs to uid {theirs.stat().st_uid}, not to you"):
        Sandbox()
    target = tmp_path / "open"
    target.mkdir()
    os.chmod(target, 0o777)
    (tmp_path / "to-open").symlink_to(target)
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(tmp_path / "to-open"))
    with pytest.raises(ConfigError, match="writable by other users"):
        Sandbox()
