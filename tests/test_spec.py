"""The typed jail contract: the spec and setup messages are strict on the wire, and a refused setup
step is explained by its step and errno, wherever it failed (launcher, child A or the init)."""

from __future__ import annotations

import dataclasses
import errno
import json
from typing import Any

import pytest

from jailbox.sandbox import Sandbox, hostids, messages
from jailbox.sandbox.checks import diagnose
from jailbox.sandbox.child import replies
from jailbox.sandbox.child.protocol import Created, CreateRequest, Failed, InitPid, Step, decode
from jailbox.sandbox.child.spec import Bind, JailSpec, NetSpec, SeccompSpec
from jailbox.sandbox.errors import KernelRefused, SandboxSetupError
from jailbox.sandbox.floor.idmap import IdMap
from jailbox.sandbox.floor.wire import WireError
from jailbox.sandbox.limits import rlimits, scratch
from jailbox.sandbox.net import modes
from jailbox.sandbox.net.policy import NetworkPolicy

pytestmark = pytest.mark.once  # parsing on the host, the same whoever runs it


def _spec(**changes: object) -> JailSpec:
    fields: dict = {
        "id": "abc",
        "dir": None,
        "stage": "/tmp/stage",
        "lower": "/tmp/lower",
        "layers": ("/tmp/layer-1/tree",),
        "trusted_lower": False,
        "system_binds": (Bind("/usr", "/usr", True, True),),
        "user_binds": (),
        "generated": {"etc/hostname": "jail\n"},
        "ca_certs": "",
        "upper": "tmpfs",
        "tmpfs_size": 1 << 20,
        "tmpfs_inodes": 1000,
        "rlimits": {"RLIMIT_NOFILE": 1024},
        "hostname": "jail",
        "net": NetSpec(new_netns=True, proxy_port=0, namespaces=("net", "user"), unreachable=("10.0.0.0/8",)),
        "workdir": "/testbed",
        "caps": 0,
        "seccomp": SeccompSpec(
            notify="AA==",
            errno="AA==",
            errno_value=1,
            in_child=False,
            audit_arch=1,
            epoll_create1=291,
            epoll_create=213,
            epoll_maker=65536,
        ),
        "userns": True,
        "idmap": IdMap("0 1000 1\n", "0 1000 1\n", helper=False, deny_setgroups=True),
        "shown_as": None,
        "pids_budget": 16384,
        "creator": 100000,
        "counters": {"max_inotify_instances": 16, "RLIMIT_SIGPENDING": 376},
        "counter_budget": {"RLIMIT_SIGPENDING": 48182},
        "ipc": scratch.ipc(1 << 20),
    }
    fields.update(changes)
    return JailSpec(**fields)


def test_spec_travels_whole_and_strictly():
    spec = _spec()
    assert JailSpec.from_wire(json.loads(json.dumps(spec.to_wire()))) == spec
    own = _spec(shown_as=IdMap("196608 393216 65536\n", "196608 393216 65536\n", helper=False, deny_setgroups=False))
    assert JailSpec.from_wire(json.loads(json.dumps(own.to_wire()))) == own
    assert decode(json.loads(json.dumps(CreateRequest(spec).to_wire())), CreateRequest) == CreateRequest(spec)
    wired = json.loads(json.dumps(spec.to_wire()))
    with pytest.raises(WireError, match="unknown"):
        JailSpec.from_wire({**wired, "network": "host"})
    missing = dict(wired)
    del missing["workdir"]
    with pytest.raises(WireError, match="missing"):
        JailSpec.from_wire(missing)
    with pytest.raises(WireError, match="is_dir: expected bool"):
        JailSpec.from_wire({**wired, "user_binds": [{"src": "/a", "dst": "/b", "is_dir": 1, "readonly": 0}]})
    with pytest.raises(WireError, match="expected bool"):
        JailSpec.from_wire({**wired, "trusted_lower": 1})
    with pytest.raises(WireError, match="upper"):
        JailSpec.from_wire({**wired, "upper": "nfs"})
    with pytest.raises(WireError, match="creator"):
        JailSpec.from_wire({**wired, "creator": "0"})  # a uid the launcher would become: never a string
    assert JailSpec.from_wire({**wired, "creator": None}).creator is None
    with pytest.raises(WireError, match="epoll_maker"):  # the id the maker becomes
        JailSpec.from_wire({**wired, "seccomp": {**wired["seccomp"], "epoll_maker": None}})


def test_messages_are_decoded_only_where_expected():
    assert decode(InitPid(7).to_wire(), InitPid) == InitPid(7)
    failed = Failed(Step.OVERLAY, errno.EINVAL, "no")
    assert decode(failed.to_wire(), InitPid) == failed  # a failure is always an answer
    with pytest.raises(WireError, match="unexpected"):
        decode(InitPid(7).to_wire(), Created)
    with pytest.raises(WireError, match="step"):
        decode({**failed.to_wire(), "step": "mount overlay"}, InitPid)


SAMPLE_REPLIES = [
    replies.ExitReply(0, None, refused={"mount": 2}, utime=0.5, stime=0.25, maxrss_kb=1024),
    replies.ExitReply(137, 9),
    replies.ExitReply(127, None, error="no such command"),
    replies.PtyOpenedReply(),
    replies.FailureReply(2, "No such file or directory"),
    replies.DoneReply(),
    replies.OpenedReply(12, 0o644),
    replies.StatReply("dir", 4096, 0o755),
    replies.WalkReply([("a", "file", 0o600, 3, None), ("b", "link", 0o777, 1, "a")]),
]


def test_the_inits_replies_are_what_the_host_reads():
    """Each reply the init builds has the fields of the host's bounded model of it, and reads back
    as it was sent (the host's models are the check; the init's dataclasses, its contract)."""
    assert {type(r) for r in SAMPLE_REPLIES} == set(replies.REPLIES)
    for cls in replies.REPLIES:
        model = getattr(messages, cls.MODEL)
        assert set(model.model_fields) == {f.name for f in dataclasses.fields(cls)}, cls.__name__
    for reply in SAMPLE_REPLIES:
        wired = json.loads(json.dumps(reply.to_wire()))  # as it travels
        read = getattr(messages, reply.MODEL).model_validate(wired)
        assert {k: getattr(read, k) for k in wired} == {k: _tupled(v) for k, v in reply.to_wire().items()}


def _tupled(value: Any) -> Any:
    return [tuple(entry) for entry in value] if isinstance(value, list) else value


def test_each_network_mode_owns_its_descriptors():
    userns = {mode: modes.for_policy(NetworkPolicy(mode=mode)).child_spec(True) for mode in modes.MODES}
    assert {mode: spec.fd_count for mode, spec in userns.items()} == {"none": 0, "host": 0, "allow": 1, "full": 2}
    assert [mode for mode, spec in userns.items() if not spec.new_netns] == ["host"]
    assert modes.for_policy(NetworkPolicy(mode="full")).child_spec(False).namespaces == ("net",)
    assert "http_proxy" in modes.for_policy(NetworkPolicy(mode="allow")).env()


@pytest.mark.parametrize(
    ("step", "err", "says"),
    [
        (Step.OVERLAY, errno.EINVAL, "overlayfs refused the writable layer"),
        (Step.ID_MAP, errno.EINVAL, "Fix: check /etc/subuid"),
        (Step.USERNS, errno.ENOSPC, "sudo sysctl -w user.max_user_namespaces=28633"),
        (Step.USERNS, errno.EINVAL, "seccomp=unconfined"),
        (Step.BIND, errno.EPERM, "the kernel refused this step inside the user namespace"),
    ],
)
def test_diagnosis_goes_by_step_and_errno_not_wording(step: Step, err: int, says: str):
    exc = diagnose.explain(Failed(step, err, "something went wrong"))
    assert isinstance(exc, KernelRefused) and says in str(exc)
    assert str(exc).startswith("something went wrong")
    plain = diagnose.explain(Failed(Step.PIVOT, errno.EINVAL, "mount overlay: user namespace uid_map"))
    assert type(plain) is SandboxSetupError  # words in the message decide nothing


def test_a_refused_id_map_is_explained_as_one(monkeypatch: pytest.MonkeyPatch):
    """A real refusal: the launcher writes a map the kernel rejects (overlapping ranges)."""
    bad = IdMap("0 0 1\n0 0 1\n", "0 0 1\n0 0 1\n", helper=False, deny_setgroups=False)
    monkeypatch.setattr(hostids, "plan", lambda mode: bad)
    monkeypatch.setattr(hostids, "claim_own_ids", lambda mode, paths: None)  # as root, the planned map itself
    with pytest.raises(KernelRefused, match="Writing the user namespace's id map failed"):
        Sandbox(idmap="single")


def test_a_refused_init_step_names_its_step(monkeypatch: pytest.MonkeyPatch):
    """A real refusal inside the init: an rlimit no process may raise to."""
    seen: list[Failed] = []
    original = diagnose.explain  # the jail imports it from diagnose when a step fails

    def explain(failed: Failed) -> Exception:
        seen.append(failed)
        return original(failed)

    planned = rlimits.plan

    def too_high(*args: Any) -> tuple[dict[str, int], Any]:
        limits, enforcement = planned(*args)
        return {**limits, "RLIMIT_NOFILE": 1 << 40}, enforcement

    monkeypatch.setattr(diagnose, "explain", explain)
    monkeypatch.setattr(rlimits, "plan", too_high)
    with pytest.raises(SandboxSetupError, match="raise maximum limit"):
        Sandbox()
    assert [f.step for f in seen] == [Step.RLIMITS]
    monkeypatch.undo()
    with Sandbox() as sb:
        assert sb.exec("true").exit_code == 0
