"""Branching through ``jailbox serve``: pause, resume on connect, fork, snapshots and the timeout lifecycle, driven
by the unmodified E2B SDK (sync and async) and by raw requests for what the SDK checks before sending.

The server runs as a subprocess on loopback; the SDK runs in a fresh interpreter. Real jails, real kernel.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.serve import KEY_A, KEY_B, Served, api, key_file, need_sdk, sdk, serving, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    need_sdk()
    tmp = tmp_path_factory.mktemp("serve-branching")
    yield from serving(tmp, "--max-per-key", "6", env=_store(tmp))


def _flags(tmp: Path) -> list[str]:
    return ["--api-key-file", str(key_file(tmp, KEY_A, KEY_B)), "--max-per-key", "6"]


def _store(tmp: Path) -> dict[str, str]:
    """A store of the module's own: its snapshots are no other test's."""
    return {"JAILBOX_CACHE_DIR": str(tmp / "cache")}


def _envd(server: Served, sid: str, token: str, method: str, path: str, data: bytes | None) -> tuple[int, dict]:
    headers = {"E2b-Sandbox-Id": sid, "X-Access-Token": token, "Content-Type": "application/json"}
    req = urllib.request.Request(server.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_pause_and_resume_on_connect_keep_processes_files_id_and_token(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        from e2b import Sandbox, SandboxNotFoundException, SandboxQuery, SandboxState

        sb = Sandbox.create(template="host", timeout=300, metadata={"suite": "pause"})
        sb.files.write("/tmp/kept", "before the pause")
        sleeper = sb.commands.run("sleep 1000", background=True, timeout=0)
        sb.commands.run("echo $$ > /tmp/shell; sleep 1000", background=True, timeout=0)
        deadline = time.monotonic() + 60
        while not sb.files.exists("/tmp/shell"):  # the shell ran before the pause, not only started
            assert time.monotonic() < deadline, "the background shell did not start"
            time.sleep(0.05)
        assert sb.is_running()
        assert sb.get_info().state == SandboxState.RUNNING
        assert sb.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": False}

        assert sb.pause() is True
        assert not sb.is_running()  # a paused sandbox answers envd as a missing one
        assert sb.pause() is False  # 409: already paused
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.PAUSED
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED], metadata={"suite": "pause"}))
        assert [s.sandbox_id for s in paused.next_items()] == [sb.sandbox_id]
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING], metadata={"suite": "pause"}))
        assert running.next_items() == []
        both = Sandbox.list(query=SandboxQuery(metadata={"suite": "pause"})).next_items()
        assert [(s.sandbox_id, s.state) for s in both] == [(sb.sandbox_id, SandboxState.PAUSED)]
        try:
            sb.commands.run("true")
            raise AssertionError("a paused sandbox ran a command")
        except Exception as exc:
            assert "was not found" in str(exc) or "not running" in str(exc).lower(), exc

        assert sb.connect() is sb  # the instance form ignores the reply: the id and token must stay
        assert sb.is_running()
        assert sb.get_info().state == SandboxState.RUNNING
        assert sb.files.read("/tmp/kept") == "before the pause"
        listed = [p.pid for p in sb.commands.list()]
        assert sleeper.pid in listed, listed  # the processes outlived the pause
        assert sb.commands.run("kill -0 $(cat /tmp/shell) && echo alive").stdout == "alive\\n"

        # the class forms, as the E2B API tests use them: the old handle works after the resume
        assert Sandbox.pause(sb.sandbox_id) is True
        assert not sb.is_running()
        again = Sandbox.connect(sb.sandbox_id)
        assert again.sandbox_id == sb.sandbox_id
        assert sb.is_running() and again.is_running()
        assert again.commands.run("cat /tmp/kept").stdout == "before the pause"

        for call in (lambda: Sandbox.pause("jbnosuchsandbox"), lambda: Sandbox.connect("jbnosuchsandbox")):
            try:
                call()
                raise AssertionError("an unknown sandbox was paused or connected")
            except SandboxNotFoundException:
                pass
        sb.kill()
        """,
    )


def test_filesystem_mode_and_reboot_end_the_processes_and_keep_the_files(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        from e2b import Sandbox, SandboxState

        def started(sb):
            sb.files.write("/root/kept", "files stay")
            return sb.commands.run("sleep 1000", background=True, timeout=0).pid

        def fresh(sb):
            assert sb.is_running()
            assert sb.files.read("/root/kept") == "files stay"
            assert sb.commands.list() == [], sb.commands.list()
            assert sb.commands.run("echo again").stdout == "again\\n"

        sb = Sandbox.create(template="host")
        started(sb)
        assert sb.pause(mode="filesystem") is True
        assert not sb.is_running() and sb.get_info().state == SandboxState.PAUSED
        sb.connect()
        fresh(sb)

        started(sb)
        assert sb.pause() is True  # full: the processes are kept...
        assert sb.get_info().state == SandboxState.PAUSED
        sb.connect(on_resume="reboot")  # ...unless the resume asks to reboot
        fresh(sb)
        sb.connect(on_resume="reboot")  # running: nothing to reboot
        assert sb.commands.run("echo still").stdout == "still\\n"
        sb.kill()

        lifecycle = {"on_timeout": {"action": "pause", "keep_memory": False}}
        sb = Sandbox.create(template="host", timeout=300, lifecycle=lifecycle)
        started(sb)
        sb.set_timeout(0)
        deadline = time.monotonic() + 30
        while Sandbox.get_info(sb.sandbox_id).state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "not paused at its timeout"
            time.sleep(0.2)
        sb.connect()
        fresh(sb)
        sb.kill()
        """,
    )
    _, made = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    sid = made["sandboxID"]  # type: ignore[index]
    try:
        for memory, mode in ((False, "filesystem"), (True, "full"), (None, "full")):
            body = {} if memory is None else {"memory": memory}
            assert api(server, "POST", f"/sandboxes/{sid}/pause", KEY_A, body)[0] == 204
            assert api(server, "GET", f"/sandboxes/{sid}", KEY_A)[1]["pauseMode"] == mode  # type: ignore[index]
            assert api(server, "POST", f"/sandboxes/{sid}/connect", KEY_A, {})[0] == 201
    finally:
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


def test_a_paused_sandbox_answers_envd_exactly_as_a_missing_one(server: Served) -> None:
    status, made = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201, made
    sid, token = made["sandboxID"], made["envdAccessToken"]  # type: ignore[index]
    try:
        calls = (
            ("GET", "/health", None),
            ("GET", "/files?path=/etc/hostname", None),
            ("POST", "/filesystem.Filesystem/Stat", b'{"path": "/"}'),
            ("POST", "/process.Process/List", b"{}"),
        )
        missing = [_envd(server, "jbmissing", token, m, p, d) for m, p, d in calls]
        assert api(server, "POST", f"/sandboxes/{sid}/pause", KEY_A, {})[0] == 204
        paused = [_envd(server, sid, token, m, p, d) for m, p, d in calls]
        assert json.dumps(paused).replace(sid, "ID") == json.dumps(missing).replace("jbmissing", "ID")
        assert paused[0][0] == 502
        assert api(server, "POST", f"/sandboxes/{sid}/pause", KEY_A, {}) == (
            409,
            {"code": 409, "message": f"sandbox {sid} is already paused"},
        )
        assert api(server, "POST", f"/sandboxes/{sid}/pause", KEY_B, {})[0] == 404  # another key's
        status, body = api(server, "POST", f"/v2/sandboxes/{sid}/connect", KEY_A, {"timeout": 60})
        assert status == 201 and body["envdAccessToken"] == token, body  # type: ignore[index]
        assert api(server, "POST", f"/v2/sandboxes/{sid}/connect", KEY_A, {})[0] == 200  # running: 200
        assert _envd(server, sid, token, "GET", "/health", None)[0] == 204
    finally:
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


@pytest.mark.slow
def test_timeout_does_not_run_while_paused_and_connect_only_extends(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        from datetime import datetime, timezone
        from e2b import Sandbox

        sb = Sandbox.create(template="host", timeout=4)
        sb.pause()
        time.sleep(6)  # past its timeout, paused: it must still be there
        Sandbox.connect(sb.sandbox_id)
        assert sb.is_running()
        left = (sb.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
        assert 0 < left <= 5, left  # what was left at the pause, not a fresh lifetime
        deadline = time.monotonic() + 60
        while sb.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sb.is_running()  # and it runs out once resumed

        sb = Sandbox.create(template="host", timeout=300)
        before = Sandbox.get_info(sb.sandbox_id).end_at
        time.sleep(1.1)
        Sandbox.connect(sb.sandbox_id, timeout=10)  # shorter: the end stays where it was
        assert Sandbox.get_info(sb.sandbox_id).end_at == before
        Sandbox.connect(sb.sandbox_id, timeout=600)
        assert Sandbox.get_info(sb.sandbox_id).end_at > before
        sb.kill()
        """,
    )


def test_lists_by_state_newest_first_and_filtered_as_e2b_lists(server: Served) -> None:
    made = []
    try:
        for _ in range(3):
            status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
            assert status == 201, body
            made.append(body["sandboxID"])  # type: ignore[index]
        assert api(server, "POST", f"/sandboxes/{made[1]}/pause", KEY_A, {})[0] == 204

        def ids(query: str) -> list[str]:
            status, listed = api(server, "GET", f"/v2/sandboxes?{query}", KEY_A)
            assert status == 200, listed
            return [s["sandboxID"] for s in listed]  # type: ignore[union-attr]

        assert ids("") == made[::-1]  # newest first, running and paused
        assert ids("order=asc") == made
        assert ids("state=paused") == [made[1]]
        assert ids("state=running") == [made[2], made[0]]
        assert ids("state=running,paused&limit=1") == [made[2]]
        assert ids("template=host") == made[::-1] and ids("template=slim") == []
        _, second = api(server, "GET", f"/sandboxes/{made[1]}", KEY_A)
        after = urllib.parse.quote(second["startedAt"])  # type: ignore[index]
        assert ids(f"startedAfter={after}") == [made[2], made[1]]
    finally:
        for sid in made:
            api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


def test_bad_pause_and_connect_requests_are_named(server: Served) -> None:
    status, made = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    sid = made["sandboxID"]  # type: ignore[index]
    try:
        for body, field in (
            ({"memory": "yes"}, "memory"),
            ({"requireHealthyGuest": 1}, "requireHealthyGuest"),
        ):
            status, answer = api(server, "POST", f"/sandboxes/{sid}/pause", KEY_A, body)
            assert status == 400 and field in answer["message"], (body, answer)  # type: ignore[index]
        for body, field in (
            ({"memory": 0}, "memory"),
            ({"timeout": 0}, "timeout"),
            ({"timeout": "60"}, "timeout"),
            ({"timeout": 10**9}, "timeout"),
        ):
            status, answer = api(server, "POST", f"/v2/sandboxes/{sid}/connect", KEY_A, body)
            assert status == 400 and field in answer["message"], (body, answer)  # type: ignore[index]
        for query, field in (
            ("state=sleeping", "state"),
            ("state=running,gone", "state"),
            ("order=up", "order"),
            ("startedAfter=yesterday", "startedAfter"),
            ("startedAfter=2026-01-31T12:00:00", "startedAfter"),  # no time zone
        ):
            status, answer = api(server, "GET", f"/v2/sandboxes?{query}", KEY_A)
            assert status == 400 and field in answer["message"], (query, answer)  # type: ignore[index]
        assert api(server, "POST", "/sandboxes/jbnosuchsandbox/pause", KEY_A, {})[0] == 404
    finally:
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


def test_async_pause_connect_and_fork(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import asyncio
        import os
        from e2b import AsyncSandbox, SandboxState

        async def main():
            sb = await AsyncSandbox.create(template="host")
            await sb.files.write("/root/async-state", "v1")
            assert await sb.pause() is True
            assert not await sb.is_running()
            assert await sb.pause() is False
            assert (await sb.get_info()).state == SandboxState.PAUSED
            await sb.connect()
            assert await sb.is_running()
            children = await sb.fork(count=2, timeout=60)
            assert len({c.sandbox_id for c in children} | {sb.sandbox_id}) == 3, children
            for child in children:
                assert await child.files.read("/root/async-state") == "v1"
                await child.kill()
            await sb.kill()

        asyncio.run(main())
        os._exit(0)  # see test_serve_e2b.test_async_sdk: the SDK's teardown aborts now and then
        """,
    )


def test_fork_children_are_sandboxes_of_their_own(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        from datetime import datetime, timezone
        from e2b import InvalidArgumentException, Sandbox, SandboxException, SandboxNotFoundException

        sb = Sandbox.create(template="host", timeout=300, metadata={"suite": "fork"})
        sb.files.write("/root/state", "v1")
        before = sb.get_info().end_at
        time.sleep(1.1)
        children = sb.fork(count=2, timeout=60)
        assert all(isinstance(c, Sandbox) for c in children), children
        ids = {c.sandbox_id for c in children}
        assert len(ids) == 2 and sb.sandbox_id not in ids
        assert sb.is_running() and sb.get_info().end_at == before  # the source is untouched
        for child in children:
            assert child.is_running()
            assert child.files.read("/root/state") == "v1"
            info = child.get_info()
            assert info.metadata == {"suite": "fork"}
            left = (info.end_at - datetime.now(timezone.utc)).total_seconds()
            assert 50 <= left <= 61, left
        children[0].files.write("/root/state", "child")
        sb.files.write("/root/state", "parent")
        assert children[1].files.read("/root/state") == "v1"
        assert children[0].files.read("/root/state") == "child"
        # each child has its own token: another's does not reach it
        assert children[0]._envd_access_token != children[1]._envd_access_token

        (one,) = Sandbox.fork(sb.sandbox_id)
        assert one.files.read("/root/state") == "parent"
        one.kill()

        try:
            sb.fork(count=0)
            raise AssertionError("count=0 was sent")
        except InvalidArgumentException:
            pass
        sb.pause()
        try:
            sb.fork()
            raise AssertionError("a paused sandbox was forked")
        except SandboxException as exc:
            assert "paused" in str(exc), exc
        sb.connect()
        for child in children:
            child.kill()
        sb.kill()
        try:
            sb.fork()
            raise AssertionError("a killed sandbox was forked")
        except SandboxNotFoundException:
            pass
        """,
    )


def test_fork_past_the_keys_limit_gives_an_error_per_child(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import RateLimitException, Sandbox

        sb = Sandbox.create(template="host")
        results = sb.fork(count=7)  # --max-per-key 6: the source and 5 children
        made = [r for r in results if isinstance(r, Sandbox)]
        refused = [r for r in results if isinstance(r, RateLimitException)]
        assert (len(made), len(refused)) == (5, 2), results
        assert "--max-per-key" in str(refused[0])
        try:
            sb.fork()
            raise AssertionError("a fork past the limit was made")
        except RateLimitException:
            pass
        for child in made:
            child.kill()
        sb.kill()
        """,
    )


def test_bad_fork_requests_are_named(server: Served) -> None:
    status, made = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    sid = made["sandboxID"]  # type: ignore[index]
    try:
        for body, field in (
            ({"count": 0}, "count"),
            ({"count": 21}, "count"),
            ({"count": "2"}, "count"),
            ({"count": True}, "count"),
            ({"count": 1.5}, "count"),
            ({"timeout": 0}, "timeout"),
            ({"timeout": -5}, "timeout"),
            ({"timeout": 10**9}, "timeout"),
        ):
            status, answer = api(server, "POST", f"/sandboxes/{sid}/fork", KEY_A, body)
            assert status == 400 and field in answer["message"], (body, answer)  # type: ignore[index]
        assert api(server, "POST", f"/sandboxes/{sid}/fork", KEY_B, {})[0] == 404  # another key's
        assert api(server, "POST", "/sandboxes/jbnosuchsandbox/fork", KEY_A, {})[0] == 404
        _, listed = api(server, "GET", "/v2/sandboxes", KEY_A)
        assert [s["sandboxID"] for s in listed] == [sid]  # type: ignore[union-attr]  # nothing half made
    finally:
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


@pytest.mark.slow
def test_on_timeout_pause_pauses_at_the_deadline_and_auto_resume_wakes_it(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        from e2b import Sandbox, SandboxState

        def wait_paused(sb):
            deadline = time.monotonic() + 30
            while Sandbox.get_info(sb.sandbox_id).state != SandboxState.PAUSED:
                assert time.monotonic() < deadline, "not paused at its timeout"
                time.sleep(0.2)

        sb = Sandbox.create(template="host", timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": False})
        assert sb.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sleeper = sb.commands.run("sleep 1000", background=True, timeout=0)
        sb.set_timeout(0)  # expires now: paused, not killed
        wait_paused(sb)
        assert not sb.is_running()
        sb.connect()
        assert sb.is_running() and sb.get_info().state == SandboxState.RUNNING
        assert sleeper.pid in [p.pid for p in sb.commands.list()]
        sb.kill()

        sb = Sandbox.create(template="host", timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
        assert sb.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        sb.files.write("/tmp/woken", "yes")
        wait_paused(sb)
        assert sb.commands.run("cat /tmp/woken").stdout == "yes"  # traffic resumed it
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.RUNNING
        sb.kill()

        sb = Sandbox.create(template="host", timeout=300)  # no lifecycle: killed at the timeout
        sb.set_timeout(0)
        deadline = time.monotonic() + 30
        while sb.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]:
            assert time.monotonic() < deadline, "not killed at its timeout"
            time.sleep(0.2)
        """,
    )


def test_bad_lifecycles_are_named(server: Served) -> None:
    for body, field in (
        ({"autoPause": "yes"}, "autoPause"),
        ({"autoPause": True, "autoPauseMemory": 1}, "autoPauseMemory"),
        ({"autoPauseMemory": False}, "autoPauseMemory"),  # without autoPause
        ({"autoPause": False, "autoPauseMemory": True}, "autoPauseMemory"),
        ({"autoPause": True, "autoResume": True}, "autoResume"),
        ({"autoPause": True, "autoResume": {"enabled": "1"}}, "autoResume"),
        ({"autoPause": True, "autoResume": {"enabled": True, "x": 1}}, "autoResume"),
        ({"autoPause": False, "autoResume": {"enabled": True}}, "autoResume"),
    ):
        status, answer = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host", **body})
        assert status == 400 and field in answer["message"], (body, answer)  # type: ignore[index]
    _, listed = api(server, "GET", "/v2/sandboxes", KEY_A)
    assert listed == []


def test_snapshots_start_sandboxes_list_by_sandbox_and_name_and_delete(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox, SandboxException

        sb = Sandbox.create(template="host")
        sb.files.write("/root/app/config.json", '{"env": "test"}')
        sb.commands.run("sleep 1000", background=True, timeout=0)
        plain = sb.create_snapshot()
        assert plain.snapshot_id.startswith("snap-") and plain.names == [], plain
        sb.files.write("/root/app/config.json", "v2")
        named = sb.create_snapshot(name="team/my_snap:v1")
        assert named.names == ["team/my_snap:v1"], named
        assert sb.files.read("/root/app/config.json") == "v2"  # the source runs on

        one = Sandbox.create(plain.snapshot_id)
        assert one.files.read("/root/app/config.json") == '{"env": "test"}'
        assert one.commands.list() == []  # a snapshot keeps files, not processes
        assert one.get_info().template_id == plain.snapshot_id
        two = Sandbox.create("team/my_snap:v1")  # by its name, '/', ':' and '_' in it
        assert two.files.read("/root/app/config.json") == "v2"
        two.files.write("/root/app/config.json", "mine")
        assert Sandbox.create(named.snapshot_id).files.read("/root/app/config.json") == "v2"

        ids = lambda p: [s.snapshot_id for s in p.next_items()]
        assert ids(Sandbox.list_snapshots()) == [named.snapshot_id, plain.snapshot_id]  # newest first
        assert ids(Sandbox.list_snapshots(sandbox_id=sb.sandbox_id)) == [named.snapshot_id, plain.snapshot_id]
        assert ids(Sandbox.list_snapshots(sandbox_id=one.sandbox_id)) == []
        assert ids(Sandbox.list_snapshots(name="team/my_snap:v1")) == [named.snapshot_id]
        assert ids(Sandbox.list_snapshots(name="team/my_snap:v1-does-not-exist")) == []
        pages = Sandbox.list_snapshots(limit=1)
        assert ids(pages) == [named.snapshot_id] and pages.has_next
        assert ids(pages) == [plain.snapshot_id] and not pages.has_next
        assert [s.names for s in Sandbox.list_snapshots(name=named.snapshot_id).next_items()] == [["team/my_snap:v1"]]

        try:
            sb.create_snapshot(mode="full")
            raise AssertionError("a memory snapshot was made")
        except SandboxException as exc:
            assert exc.status_code == 400 and "memory" in str(exc), exc
        try:
            Sandbox.delete_snapshot(plain.snapshot_id)  # one's jail runs over it
            raise AssertionError("a snapshot in use was deleted")
        except SandboxException as exc:
            assert exc.status_code == 409, exc
        for made in Sandbox.list().next_items():
            if made.sandbox_id != sb.sandbox_id:
                Sandbox.kill(made.sandbox_id)
        assert Sandbox.delete_snapshot(plain.snapshot_id) is True
        assert Sandbox.delete_snapshot(plain.snapshot_id) is False
        assert Sandbox.delete_snapshot("team/my_snap:v1") is True  # by name, percent-encoded on the way
        assert ids(Sandbox.list_snapshots()) == []
        try:
            Sandbox.create(plain.snapshot_id)
            raise AssertionError("a deleted snapshot started a sandbox")
        except SandboxException as exc:
            assert exc.status_code == 400 and "templateID" in str(exc), exc
        sb.kill()
        """,
    )


def test_a_keys_snapshots_are_invisible_to_another_key(server: Served, tmp_path: Path) -> None:
    made = sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox

        sb = Sandbox.create(template="host")
        sb.files.write("/root/secret", "of key a")
        print(sb.create_snapshot(name="mine").snapshot_id)
        sb.kill()
        """,
    ).strip()
    try:
        sdk(
            server,
            tmp_path,
            f"""
            from e2b import Sandbox, SandboxException

            assert Sandbox.list_snapshots().next_items() == []
            assert Sandbox.list_snapshots(name="mine").next_items() == []
            for ref in ("{made}", "mine"):
                try:
                    Sandbox.create(ref)
                    raise AssertionError("another key started from a snapshot")
                except SandboxException as exc:
                    assert exc.status_code == 400, exc
                assert Sandbox.delete_snapshot(ref) is False
            """,
            key=KEY_B,
        )
        status, listed = api(server, "GET", "/snapshots", KEY_A)
        assert status == 200 and [s["snapshotID"] for s in listed] == [made]  # type: ignore[union-attr]
    finally:
        api(server, "DELETE", f"/templates/{made}", KEY_A)


@pytest.mark.slow
def test_snapshots_outlive_the_server(server: Served, tmp_path: Path) -> None:
    tmp = tmp_path / "second"
    tmp.mkdir()
    first = start_server(tmp, *_flags(tmp), env=_store(tmp))
    try:
        made = sdk(
            first,
            tmp,
            """
            from e2b import Sandbox

            sb = Sandbox.create(template="host")
            sb.files.write("/root/kept", "across a restart")
            print(sb.create_snapshot(name="kept").snapshot_id)
            """,
        ).strip()
    finally:
        first.stop()
    again = start_server(tmp, *_flags(tmp), env=_store(tmp))
    try:
        sdk(
            again,
            tmp,
            f"""
            from e2b import Sandbox

            assert [s.snapshot_id for s in Sandbox.list_snapshots().next_items()] == ["{made}"]
            sb = Sandbox.create("kept")
            assert sb.files.read("/root/kept") == "across a restart"
            sb.kill()
            assert Sandbox.delete_snapshot("{made}")
            """,
        )
    finally:
        again.stop()


def test_bad_snapshot_requests_are_named(server: Served) -> None:
    status, made = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    sid = made["sandboxID"]  # type: ignore[index]
    try:
        for body, field in (
            ({"name": ""}, "name"),
            ({"name": "a" * 65}, "name"),
            ({"name": "../x"}, "name"),
            ({"name": "a b"}, "name"),
            ({"name": "x@y"}, "name"),
            ({"name": "snap-0123456789ab"}, "name"),  # an id's shape
            ({"name": 7}, "name"),
            ({"memory": True}, "memory"),
            ({"memory": "no"}, "memory"),
        ):
            status, answer = api(server, "POST", f"/sandboxes/{sid}/snapshots", KEY_A, body)
            assert status == 400 and field in answer["message"], (body, answer)  # type: ignore[index]
        for query, field in (
            ("limit=0", "limit"),
            ("limit=101", "limit"),
            ("limit=x", "limit"),
            ("nextToken=-1", "nextToken"),
            ("nextToken=abc", "nextToken"),
            ("name=" + "a" * 300, "name"),
            ("sandboxID=" + "a" * 300, "sandboxID"),
        ):
            status, answer = api(server, "GET", f"/snapshots?{query}", KEY_A)
            assert status == 400 and field in answer["message"], (query, answer)  # type: ignore[index]
        for ref in ("%ff%fe", "a" * 300, "%00"):
            status, answer = api(server, "DELETE", f"/templates/{ref}", KEY_A)
            assert status == 400 and "snapshot id" in answer["message"], (ref, answer)  # type: ignore[index]
        assert api(server, "DELETE", "/templates/default", KEY_A)[0] == 404  # a root filesystem is not deleted
        assert api(server, "POST", f"/sandboxes/{sid}/snapshots", KEY_B, {})[0] == 404  # another key's sandbox
        assert api(server, "GET", "/snapshots", KEY_A) == (200, [])  # nothing half made
    finally:
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


def test_a_keys_snapshots_are_bounded(server: Served) -> None:
    status, made = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    sid = made["sandboxID"]  # type: ignore[index]
    taken: list[str] = []
    try:
        while True:
            status, answer = api(server, "POST", f"/sandboxes/{sid}/snapshots", KEY_A, {})
            if status != 201:
                break
            taken.append(answer["snapshotID"])  # type: ignore[index]
            assert len(taken) <= 64
        assert status == 429 and "64 snapshots" in answer["message"], answer  # type: ignore[index]
        _, held = api(server, "GET", "/snapshots", KEY_A)
        assert len(held) == 64  # type: ignore[arg-type]  # the key's, made here or left by another test
        assert api(server, "GET", "/snapshots", KEY_B) == (200, [])  # another key's bound is its own
        assert api(server, "DELETE", f"/templates/{taken.pop()}", KEY_A)[0] == 204
        status, answer = api(server, "POST", f"/sandboxes/{sid}/snapshots", KEY_A, {})
        assert status == 201, answer
        taken.append(answer["snapshotID"])  # type: ignore[index]
    finally:
        for ref in taken:
            api(server, "DELETE", f"/templates/{ref}", KEY_A)
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


@pytest.mark.slow
def test_a_sandbox_paused_at_a_stop_is_served_paused_again_with_fresh_processes(server: Served, tmp_path: Path) -> None:
    tmp = tmp_path / "restart"
    tmp.mkdir()
    first = start_server(tmp, *_flags(tmp), env=_store(tmp))
    try:
        made = sdk(
            first,
            tmp,
            """
            from e2b import Sandbox

            sb = Sandbox.create(template="host", timeout=120, metadata={"kept": "yes"}, envs={"KEPT": "env"},
                                lifecycle={"on_timeout": "pause", "auto_resume": False})
            sb.files.write("/root/kept", "across a restart")
            sb.commands.run("sleep 1000", background=True, timeout=0)
            sb.pause()
            Sandbox.create(template="host")  # running: closed with the server, not kept
            print(sb.sandbox_id, sb._envd_access_token)
            """,
        ).split()
    finally:
        first.stop()
    sid, token = made
    records = tmp / "keys.paused"
    assert records.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in records.iterdir()] == [f"{sid}.json"]
    assert (records / f"{sid}.json").stat().st_mode & 0o777 == 0o600
    (tmp / "keys").write_text(KEY_B + "\n")  # a key file without the key that made it: not served
    other_key = start_server(tmp, "--api-key-file", str(tmp / "keys"), env=_store(tmp))
    try:
        assert api(other_key, "GET", "/v2/sandboxes", KEY_B) == (200, [])
        assert api(other_key, "POST", f"/v2/sandboxes/{sid}/connect", KEY_B, {})[0] == 404
    finally:
        other_key.stop()
    assert [p.name for p in records.iterdir()] == [f"{sid}.json"]
    passing = start_server(tmp, *_flags(tmp), env=_store(tmp))  # serves it paused, and keeps it again
    try:
        assert api(passing, "GET", f"/sandboxes/{sid}", KEY_A)[1]["state"] == "paused"  # type: ignore[index]
    finally:
        passing.stop()
    again = start_server(tmp, *_flags(tmp), env=_store(tmp))
    try:
        sdk(
            again,
            tmp,
            f"""
            from datetime import datetime, timezone
            from e2b import Sandbox, SandboxState

            listed = Sandbox.list().next_items()
            assert [(s.sandbox_id, s.state) for s in listed] == [("{sid}", SandboxState.PAUSED)], listed
            assert Sandbox.list_snapshots().next_items() == []  # what keeps it is not the key's snapshot
            info = Sandbox.get_info("{sid}")
            assert info.metadata == {{"kept": "yes"}}
            assert info.lifecycle == {{"on_timeout": "pause", "auto_resume": False}}
            sb = Sandbox.connect("{sid}")
            assert sb._envd_access_token == "{token}"  # a handle from before the stop works on
            assert sb.files.read("/root/kept") == "across a restart"
            assert sb.commands.list() == []  # processes do not outlive the server
            assert sb.commands.run("echo $KEPT").stdout == "env\\n"
            left = (sb.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
            assert 100 <= left <= 121, left  # the lifetime it had left
            sb.kill()
            """,
        )
        assert list(records.iterdir()) == []
        assert [p.name for p in (tmp / "cache" / "snapshots").iterdir() if p.name.startswith("snap-")] == []
    finally:
        again.stop()
    other = tmp_path / "other"
    other.mkdir()
    (other / "keys").write_text(KEY_B + "\n")
    (other / "keys").chmod(0o600)
    (other / "keys.paused").mkdir(mode=0o755)
    (other / "keys.paused").chmod(0o755)
    refused = start_server_failing(other, "--api-key-file", str(other / "keys"))
    assert "keys.paused" in refused and "0700" in refused and "--api-key-file" in refused, refused


def start_server_failing(tmp: Path, *args: str) -> str:
    r = subprocess.run(
        [*JAILBOX, "serve", "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=60,
    )
    assert r.returncode != 0, r.stderr
    return r.stderr
