"""exec: exit status, output capture and caps, timeouts, background processes (acceptance point 3)."""

from __future__ import annotations

import os
import resource

import pytest
from conftest import own_for_jails

from jailbox.sandbox import Sandbox


def _count(sb: Sandbox, name: str) -> int:
    r = sb.exec(
        f'n=0; for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = {name} ] && n=$((n+1)); done; echo $n'
    )
    return int(r.stdout)


def test_exit_codes_signals_and_separate_streams(sb):
    r = sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.signal, r.timed_out) == (3, "out\n", "err\n", None, False)
    killed = sb.exec("kill -9 $$")
    assert killed.signal == 9 and killed.exit_code == 137
    assert sb.exec(["printf", "%s|", "a b", "$HOME", "'q'"]).stdout == "a b|$HOME|'q'|"


def test_missing_command_and_cwd_are_reported(sb):
    r = sb.exec(["no-such-program"])
    assert r.exit_code == 127 and "no-such-program" in r.stderr
    r = sb.exec("true", cwd="/does/not/exist")
    assert r.exit_code == 127 and "/does/not/exist" in r.stderr


def test_cwd_env_and_stdin(sb):
    r = sb.exec("pwd; echo $GREETING; cat", cwd="/tmp", env={"GREETING": "hello"}, stdin=b"from stdin")
    assert r.stdout == "/tmp\nhello\nfrom stdin"
    big = bytes(range(256)) * 20000
    assert sb.exec("sha256sum", stdin=big).stdout.split()[0] == __import__("hashlib").sha256(big).hexdigest()


def test_timeout_kills_setsid_and_double_forked_descendants(sb):
    r = sb.exec(
        "setsid sleep 1001 & (setsid sh -c 'sleep 1002 &' &) ; (sleep 1003 &);"
        "nohup sleep 1004 >/dev/null 2>&1 & sleep 1005",
        timeout=1,
    )
    assert r.timed_out and r.signal == 9
    assert _count(sb, "sleep") == 0
    assert sb.exec("echo still usable").stdout == "still usable\n"


def test_background_server_survives_and_answers_later_exec(sb):
    start = sb.exec("python3 -m http.server 8123 --bind 127.0.0.1 &", timeout=30)
    assert start.exit_code == 0 and not start.timed_out
    probe = (
        "import time, urllib.request\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        print(urllib.request.urlopen('http://127.0.0.1:8123/').status); break\n"
        "    except OSError: time.sleep(0.05)\n"
    )
    for _ in range(3):  # the server logs every request to the stderr it inherited
        r = sb.exec(["python3", "-c", probe], timeout=60)
        assert r.stdout.strip() == "200", r.stderr


def test_exec_returns_when_its_own_process_ends(sb):
    r = sb.exec("sleep 300 & echo started", timeout=60)
    assert not r.timed_out and r.stdout == "started\n"
    assert _count(sb, "sleep") == 1


@pytest.mark.slow
def test_one_gib_of_output_is_capped_head_and_tail(sb):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = sb.exec("echo HEAD; head -c 1073741824 /dev/zero; echo TAIL", timeout=600)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    limit = sb.config.output_limit
    assert r.exit_code == 0
    assert len(r.stdout_bytes) == limit
    assert r.stdout_truncated and r.stdout_dropped == 1073741824 + 10 - limit
    assert r.stdout_bytes.startswith(b"HEAD\n") and r.stdout_bytes.endswith(b"TAIL\n")
    assert f"[... {r.stdout_dropped} bytes dropped" in r.stdout
    assert (after - before) * 1024 < 64 * limit


def test_output_limit_is_configurable():
    with Sandbox(output_limit="1K") as sb:
        r = sb.exec("seq 1 10000")
        assert len(r.stdout_bytes) == 1024 and r.stdout.startswith("1\n2\n") and r.stdout.endswith("10000\n")


def test_invalid_utf8_is_replaced_in_text_and_intact_in_bytes(sb):
    r = sb.exec(r"printf 'ok\377\376end'; printf '\200' >&2")
    assert r.stdout_bytes == b"ok\xff\xfeend"
    assert r.stdout == "ok\ufffd\ufffdend"
    assert r.stderr_bytes == b"\x80" and r.stderr == "\ufffd"


def test_streaming_callbacks_receive_chunks(sb):
    out: list[bytes] = []
    err: list[bytes] = []
    r = sb.exec(
        "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.05; done", on_stdout=out.append, on_stderr=err.append
    )
    assert b"".join(out) == b"1\n2\n3\n" == r.stdout_bytes
    assert b"".join(err) == b"e1\ne2\ne3\n"


def test_sh_is_used_where_there_is_no_bash(tmp_path, mini_rootfs):
    import shutil

    root = tmp_path / "nobash"
    shutil.copytree(mini_rootfs, root, symlinks=True)
    (root / "bin" / "bash").unlink()
    if os.getuid() == 0:
        own_for_jails(root)  # copytree made it host root's
    with Sandbox(rootfs=str(root)) as sb:
        r = sb.exec("echo $((6*7))")
        assert r.exit_code == 0 and r.stdout == "42\n"


def test_sigpipe_behaves_normally(sb):
    r = sb.exec("yes | head -n 2; echo ${PIPESTATUS[0]}")
    assert r.stdout == "y\ny\n141\n"
