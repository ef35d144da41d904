"""The host's requests to a jail's init are typed and strict on the wire, and a real init answers a
malformed one with an error (never a guess, never its own death) and goes on serving."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.channel import parse_reply
from jailbox.sandbox.child.requests import (
    DrainRequest,
    ExecRequest,
    KillRequest,
    MkdirRequest,
    OpenRequest,
    RunAs,
    StatRequest,
    SymlinkRequest,
    WalkRequest,
    decode_request,
    wants_reply,
)
from jailbox.sandbox.errors import SandboxFileError
from jailbox.sandbox.floor import wire
from jailbox.sandbox.floor.wire import WireError
from jailbox.sandbox.messages import Done

pytestmark = pytest.mark.once  # the typed requests are the same whoever runs them

EXEC = ExecRequest(
    id=3, argv=None, shell="echo hi", cwd="/", env={"PATH": "/bin"}, tty=False, user=RunAs(1000, 1000, (1000, 27))
)
EVERY = [
    EXEC,
    ExecRequest(id=4, argv=("ls", "-l"), shell=None, cwd="/tmp", env={}, tty=True, user=None),
    KillRequest(3),
    DrainRequest(),
    OpenRequest(path="/etc/passwd", write=False, mode=None, parents=False),
    OpenRequest(path="/a/b", write=True, mode=0o600, parents=True),
    StatRequest("/etc"),
    MkdirRequest("/a", 0o755),
    WalkRequest("/usr"),
    SymlinkRequest(path="/a/l", target="../b"),
]


def _wired(req: Any) -> dict[str, Any]:
    return json.loads(json.dumps(req.to_wire()))


@pytest.mark.parametrize("req", EVERY, ids=lambda r: r.OP)
def test_each_request_travels_whole(req: Any):
    assert decode_request(_wired(req)) == req
    assert wants_reply(_wired(req)) == (req.OP not in ("kill", "drain"))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"op": "spawn"}, "unknown request 'spawn'"),
        ({"op": 1}, "without an op"),
        ({"uid": 0}, r"unknown \['uid'\]"),
        ({"id": True}, "id: expected int"),
        ({"id": "3"}, "id: expected int"),
        ({"tty": 1}, "tty: expected bool"),
        ({"env": {"PATH": 1}}, "env: expected a map of str to str"),
        ({"argv": ["ls"]}, "exactly one of argv and shell"),
        ({"shell": None}, "exactly one of argv and shell"),
        ({"shell": None, "argv": []}, "argv: empty"),
        ({"shell": None, "argv": ["ls", 1]}, "argv: expected a list of strings"),
        ({"user": [1000, 1000, []]}, "RunAs: expected an object"),
        ({"user": {"uid": 0, "gid": 0, "groups": [True]}}, "groups: expected a list of integers"),
        ({"user": {"uid": 0, "gid": 0}}, r"missing \['groups'\]"),
    ],
)
def test_a_malformed_exec_is_refused(change: dict[str, Any], says: str):
    with pytest.raises(WireError, match=says):
        decode_request({**_wired(EXEC), **change})


def test_every_key_is_required_and_checked():
    for req in EVERY:
        wired = _wired(req)
        for key in set(wired) - {"op"}:
            with pytest.raises(WireError, match="missing"):
                decode_request({k: v for k, v in wired.items() if k != key})
    with pytest.raises(WireError, match="write: expected bool"):
        decode_request({**_wired(EVERY[4]), "write": 0})
    with pytest.raises(WireError, match="mode: expected int"):
        decode_request({**_wired(EVERY[7]), "mode": None})
    with pytest.raises(WireError, match="unknown"):
        decode_request({**_wired(DrainRequest()), "fds": 2})
    with pytest.raises(WireError, match="without an op"):
        decode_request([])
    assert wants_reply({"op": "nonsense"}) and wants_reply({}) and not wants_reply({"op": "drain", "x": 1})


def _raw_call(sb: Sandbox, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send ``obj`` as it is, past the typed requests, and parse the init's answer (``Done`` or a failure)."""
    mine, theirs = wire.seqpacket_pair()
    with mine:
        try:
            wire.send(sb._channel.sock, obj, [*(fds or []), theirs.fileno()])
        finally:
            theirs.close()
        assert wire.wait_readable(mine, 30), "the init did not answer"
        parse_reply(mine, Done, 0, None)


@pytest.mark.parametrize(
    "obj",
    [
        {"op": "mkdir", "path": "/tmp/x", "mode": "0755"},
        {"op": "mkdir", "path": "/tmp/x"},
        {"op": "mkdir", "path": "/tmp/x", "mode": 0o755, "parents": True},
        {"op": "rmtree", "path": "/"},
        {"path": "/tmp/x"},
        {"op": "exec", "id": 1, "argv": "id", "shell": None, "cwd": "/", "env": {}, "tty": False, "user": None},
        {"op": "exec", "id": 1, "argv": ["id"], "shell": None, "cwd": "/", "env": {}, "tty": False, "user": [0, 0, []]},
    ],
)
def test_a_real_init_answers_a_malformed_request_and_keeps_serving(obj: dict[str, Any]):
    with Sandbox() as sb:
        with pytest.raises(SandboxFileError, match="WireError"):
            _raw_call(sb, obj)
        assert sb.exec("test -e /tmp/x").exit_code != 0  # nothing was done on a guess
        assert sb.exec("echo still here").stdout == "still here\n"


def test_a_malformed_one_way_request_is_dropped_and_its_descriptors_closed():
    with Sandbox() as sb:
        r, w = os.pipe()
        try:
            wire.send(sb._channel.sock, {"op": "drain", "into": "/tmp"}, [r])  # malformed: the pipe is not kept
            wire.send(sb._channel.sock, {"op": "kill", "id": "all"})
            os.close(r)
            assert sb.exec("echo still here").stdout == "still here\n"
            with pytest.raises(BrokenPipeError):  # the init closed the pipe's only other read end
                os.write(w, b"x")
        finally:
            os.close(w)


def test_a_reply_descriptor_that_is_no_socket_is_closed_not_kept():
    with Sandbox() as sb:
        r, w = os.pipe()
        try:
            wire.send(sb._channel.sock, {"op": "stat", "path": "/"}, [r])
            os.close(r)
            assert sb.exec("echo still here").stdout == "still here\n"
            with pytest.raises(BrokenPipeError):  # closed by the init, not kept as a reply socket
                os.write(w, b"x")
        finally:
            os.close(w)
