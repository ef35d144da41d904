"""Bad input gets a clear error before anything is forked."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jailbox.sandbox import Mount, Sandbox, SandboxConfig
from jailbox.sandbox.config import parse_size
from jailbox.sandbox.errors import ExecError, RootfsNotFound, SandboxClosed

pytestmark = pytest.mark.once  # validation on the host, the same whoever runs it


def test_sizes():
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5g") == 3 << 29
    assert parse_size("64KiB") == 64 << 10
    assert parse_size(4096) == 4096
    for bad in ("lots", "-1G", 0, True):
        with pytest.raises(ValueError):
            parse_size(bad)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hostname", "bad host!", "not a valid hostname"),
        ("workdir", "relative/dir", "absolute path"),
        ("workdir", "/proc", "reserved"),
        ("env", {"BAD NAME": "x"}, "invalid"),
        ("network", "sideways", "Input should be 'none', 'host', 'allow' or 'full'"),
        ("upper", "ram", "Input should be 'disk' or 'tmpfs'"),
        ("tmpfs_size", "huge", "cannot read size"),
        ("no_such_option", 1, "Extra inputs are not permitted"),
    ],
)
def test_invalid_config_names_the_field(field, value, message):
    with pytest.raises(ValidationError) as info:
        SandboxConfig(**{field: value})
    assert message in str(info.value)
    assert field in str(info.value)


def test_mounts_are_validated(tmp_path):
    with pytest.raises(ValidationError, match="does not exist"):
        Mount(tmp_path / "missing", "/x")
    with pytest.raises(ValidationError, match="must not contain"):
        Mount(tmp_path, "/testbed/../etc")
    with pytest.raises(ValidationError, match="over the jail's root"):
        Mount(tmp_path, "/")
    with pytest.raises(ValidationError, match="two mounts"):
        SandboxConfig(mounts=[Mount(tmp_path, "/a"), Mount(tmp_path, "/a/")])
    m = Mount.parse(f"{tmp_path}:/data:rw")
    assert (m.src, m.dst, m.readonly) == (tmp_path, "/data", False)
    with pytest.raises(ValueError, match="SRC:DST"):
        Mount.parse("only-one-part")


def test_missing_rootfs_is_a_clear_error(tmp_path):
    with pytest.raises(RootfsNotFound, match=str(tmp_path / "nope")):
        Sandbox(rootfs=str(tmp_path / "nope"))
    (tmp_path / "file").write_text("")
    with pytest.raises(RootfsNotFound):
        Sandbox(rootfs=str(tmp_path / "file"))


def test_closed_sandbox_and_bad_commands():
    sb = Sandbox()
    with pytest.raises(ExecError):
        sb.exec([])
    with pytest.raises(ExecError):
        sb.exec("echo \0")
    sb.close()
    with pytest.raises(SandboxClosed):
        sb.exec("true")
    with pytest.raises(SandboxClosed):
        sb.read_file("/etc/hostname")


def test_config_object_and_keyword_overrides():
    cfg = SandboxConfig(hostname="from-config")
    with Sandbox(cfg, env={"X": "1"}) as sb:
        assert sb.exec("hostname; echo $X").stdout == "from-config\n1\n"
    assert cfg.env == {}
