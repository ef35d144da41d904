"""A sandbox's own network through the unmodified E2B SDK: ``allow_internet_access`` and
``network={"allow_out", "deny_out"}`` at create, ``update_network`` live, all held within the
server's ``--network``. Stand-in upstreams listen on 127.0.0.2 and 127.0.0.3 (outside the jail's
``NO_PROXY``, so a jailed curl goes through the proxy); the server's ``--network`` allows
``127.0.0.0/24`` on every port but denies ``127.0.0.4``. Runs as root and rootless alike."""

from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need
from support.serve import KEY_A, KEY_B, Served, api, key_file, need_sdk, sdk, start_server
from support.standin import StandIn

CEILING = "allow:127.0.0.0/24:*,!127.0.0.4"
TUNNEL = """
import os, socket, time
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT 127.0.0.2:{port} HTTP/1.1\\r\\nHost: 127.0.0.2:{port}\\r\\n\\r\\n")
assert s.recv(4096).startswith(b"HTTP/1.1 200"), "tunnel refused"
open("/tmp/open", "w").close()
while not os.path.exists("/tmp/go"):
    time.sleep(0.02)
s.sendall(b"GET /hello HTTP/1.1\\r\\nHost: 127.0.0.2\\r\\nConnection: close\\r\\n\\r\\n")
got = b""
while chunk := s.recv(4096):
    got += chunk
print(got.decode().splitlines()[-1])
"""
"""A jailed program holding a tunnel open through the proxy, used once ``/tmp/go`` appears."""


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[StandIn, StandIn, StandIn]]:
    need("curl")
    ups = (StandIn("127.0.0.2"), StandIn("127.0.0.3"), StandIn("127.0.0.4"))
    yield ups
    for up in ups:
        up.close()


def _server(tmp: Path, network: str) -> Served:
    need_sdk()
    return start_server(tmp, "--api-key-file", str(key_file(tmp, KEY_A, KEY_B)), "--network", network, "--warm", "1")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstreams: tuple[StandIn, ...]) -> Iterator[Served]:
    served = _server(tmp_path_factory.mktemp("serve-network"), CEILING)
    yield served
    served.stop()


def _prelude(upstreams: tuple[StandIn, ...]) -> str:
    """SDK code's helpers: ``reach(sb)`` is which of the upstreams answer (``2``, ``3``, ``4``)."""
    ports = {f"127.0.0.{i + 2}": up.port for i, up in enumerate(upstreams)}
    return textwrap.dedent(f"""
        from e2b import ALL_TRAFFIC, Sandbox, SandboxException

        PORTS = {ports!r}

        def reach(sb):
            got = sb.commands.run(
                "for a in " + " ".join(f"{{ip}}:{{port}}" for ip, port in PORTS.items())
                + "; do curl -sS -m 10 http://$a/hello 2>&1; echo; done"
            ).stdout
            return "".join(ip[-1] for ip in PORTS if f"hello from {{ip}}:" in got)

        def refused(call, *says):
            try:
                call()
            except SandboxException as exc:
                assert all(s in str(exc) for s in says), (str(exc), says)
                assert "500" not in str(exc), str(exc)
                return
            raise AssertionError(f"not refused: {{says}}")
        """)


def _run(server: Served, tmp: Path, upstreams: tuple[StandIn, ...], code: str) -> str:
    return sdk(server, tmp, _prelude(upstreams) + textwrap.dedent(code))


@pytest.mark.slow
def test_a_request_allowed_then_denied_by_update_network_then_allowed_again(
    server: Served, upstreams: tuple[StandIn, ...], tmp_path: Path
) -> None:
    _run(
        server,
        tmp_path,
        upstreams,
        """
        sb = Sandbox.create("host", network={"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]})
        assert reach(sb) == "2"
        sb.update_network({"deny_out": ["127.0.0.2"]})   # everything but .2: within the server's, so .3
        assert reach(sb) == "3"
        sb.update_network({"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]})
        assert reach(sb) == "2"
        sb.update_network({})                            # an update replaces all: everything the server allows
        assert reach(sb) == "23"
        sb.update_network({"allow_internet_access": False})
        assert reach(sb) == ""
        sb.kill()

        # at create: no internet, then E2B's precedence (an allow entry wins over a deny range)
        dark = Sandbox.create("host", allow_internet_access=False)
        assert reach(dark) == ""
        dark.update_network({"allow_out": ["127.0.0.3"], "deny_out": [ALL_TRAFFIC]})
        assert reach(dark) == "3"
        dark.kill()
        mixed = Sandbox.create("host", network={"allow_out": ["127.0.0.3"], "deny_out": ["127.0.0.0/24"]})
        assert reach(mixed) == "3"
        mixed.kill()
        plain = Sandbox.create("host")                  # nothing asked: the server's network
        assert reach(plain) == "23"
        plain.kill()

        import asyncio
        from e2b import AsyncSandbox

        async def main():
            sb = await AsyncSandbox.create("host", allow_internet_access=False)
            await sb.update_network({"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]})
            got = (await sb.commands.run(f"curl -sS -m 10 http://127.0.0.2:{PORTS['127.0.0.2']}/hello")).stdout
            await sb.kill()
            return got

        assert asyncio.run(main()).startswith("hello from 127.0.0.2")
        """,
    )


@pytest.mark.slow
def test_a_connection_open_before_the_update_is_kept_and_new_ones_follow_it(
    server: Served, upstreams: tuple[StandIn, ...], tmp_path: Path
) -> None:
    port = upstreams[0].port
    _run(
        server,
        tmp_path,
        upstreams,
        f"""
        import time

        sb = Sandbox.create("host")
        sb.files.write("/tmp/tunnel.py", {TUNNEL.format(port=port)!r})
        held = sb.commands.run("python3 /tmp/tunnel.py", background=True)
        for _ in range(500):
            if sb.files.exists("/tmp/open"):
                break
            time.sleep(0.02)
        sb.update_network({{"deny_out": ["127.0.0.2"]}})
        assert reach(sb) == "3"                          # a new connection follows the new rules at once
        sb.files.write("/tmp/go", "")
        assert held.wait().stdout.startswith("hello from 127.0.0.2"), "the open tunnel was cut"
        sb.kill()
        """,
    )


@pytest.mark.slow
def test_a_caller_cannot_widen_past_the_servers_network(
    server: Served, upstreams: tuple[StandIn, ...], tmp_path: Path
) -> None:
    _run(
        server,
        tmp_path,
        upstreams,
        """
        for network in ({"allow_out": ["10.0.0.1"]}, {"allow_out": ["example.com"], "deny_out": [ALL_TRAFFIC]},
                        {"allow_out": ["127.0.0.4"]}, {"allow_out": ["10.0.0.0/8", "127.0.0.2"]}):
            refused(lambda: Sandbox.create("host", network=network), "403", "--network")
        assert Sandbox.list().next_items() == []          # nothing was made for a refused ask

        sb = Sandbox.create("host", network={"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]})
        refused(lambda: sb.update_network({"allow_out": ["10.0.0.0/8"]}), "403", "--network allow:10.0.0.0/8:*")
        assert reach(sb) == "2"                            # a refused update changes nothing

        # the operator's deny wins over a caller's allow, whatever covers it
        for ask in ({"allow_out": ["127.0.0.0/24"], "deny_out": [ALL_TRAFFIC]}, {}, {"allow_out": [ALL_TRAFFIC]},
                    {"allow_internet_access": True}, {"allow_out": ["0.0.0.0/1"], "deny_out": [ALL_TRAFFIC]}):
            sb.update_network(ask)
            assert reach(sb) == "23", ask
        sb.kill()
        """,
    )


def test_hostile_network_asks_get_the_sdks_error_never_a_500(server: Served, tmp_path: Path) -> None:
    status, made = api(server, "POST", "/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201, made
    sid = made["sandboxID"]  # type: ignore[index]
    bad: list[object] = [
        {"allowOut": [f"10.0.{i // 256}.{i % 256}" for i in range(257)]},
        {"allowOut": ["a" * 600 + ".com"]},
        {"allowOut": ["10.0.0.0/33"]},
        {"allowOut": ["999.1.1.1"]},
        {"allowOut": ["::gg"]},
        {"allowOut": [1]},
        {"allowOut": [None]},
        {"allowOut": [{"x": 1}]},
        {"allowOut": [["nested"]]},
        {"allowOut": "10.0.0.1"},
        {"allowOut": {"10.0.0.1": True}},
        {"allowOut": ["*"]},
        {"allowOut": ["bad..name"]},
        {"allowOut": ["*.*.example.com"]},
        {"allowOut": [""]},
        {"denyOut": ["example.com"]},
        {"denyOut": [7]},
        {"allow_internet_access": "yes"},
        {"allow_internet_access": 0},
        {"rules": {"api.example.com": [{"transform": {"headers": {"X": "y"}}}]}},
        {"egressProxy": {"address": "proxy.example.com:1080"}},
        {"denyOut": ["0.0.0.0/1"], "allowOut": [f"1.{i}.0.1" for i in range(120)]},  # denyOut less allowOut explodes
    ]
    for body in bad:
        status, answer = api(server, "PUT", f"/sandboxes/{sid}/network", KEY_A, body)
        assert status in (400, 403), (body, status, answer)
        message = answer["message"]  # type: ignore[index]
        assert "\n" not in message and len(message) < 400, message
        named = [k for k in body if k in message]  # type: ignore[union-attr]
        assert named or "--network" in message, (body, message)
    for body in bad[:-1]:
        create = {
            "templateID": "host",
            **(
                {"allow_internet_access": body["allow_internet_access"]}  # type: ignore[index]
                if "allow_internet_access" in body
                else {"network": body}
            ),
        }  # type: ignore[operator]
        status, answer = api(server, "POST", "/sandboxes", KEY_A, create)
        assert status in (400, 403), (create, status, answer)
    for network in ([], "x", 3):
        status, answer = api(server, "POST", "/sandboxes", KEY_A, {"templateID": "host", "network": network})
        assert status == 400 and "network must be an object" in answer["message"], answer  # type: ignore[index]
    req = urllib.request.Request(
        f"{server.url}/sandboxes/{sid}/network", data=b"[1,", headers={"X-API-Key": KEY_A}, method="PUT"
    )
    with pytest.raises(urllib.error.HTTPError) as bad_json:
        urllib.request.urlopen(req, timeout=60)
    assert bad_json.value.code == 400 and "JSON" in json.loads(bad_json.value.read())["message"]
    assert api(server, "PUT", "/sandboxes/jbnothere/network", KEY_A, {})[0] == 404
    assert api(server, "PUT", f"/sandboxes/{sid}/network", KEY_B, {})[0] == 404  # another key's: as missing
    assert api(server, "PUT", f"/sandboxes/{sid}/network", None, {})[0] == 401
    assert api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)[0] == 204
    listed = api(server, "GET", "/v2/sandboxes", KEY_A)[1]
    assert listed == [], listed  # no refused create left a sandbox behind


@pytest.mark.slow
def test_a_server_without_a_network_refuses_asks_for_one(upstreams: tuple[StandIn, ...], tmp_path: Path) -> None:
    none = _server(tmp_path, "none")
    try:
        _run(
            none,
            tmp_path,
            upstreams,
            """
            default = Sandbox.create("host", allow_internet_access=True)  # E2B's default: all the server allows
            assert reach(default) == ""
            default.kill()
            refused(lambda: Sandbox.create("host", network={"allow_out": ["127.0.0.2"]}), "403", "--network")
            sb = Sandbox.create("host", allow_internet_access=False)
            sb.update_network({"deny_out": [ALL_TRAFFIC]})
            sb.update_network({})                   # everything the server allows: nothing
            refused(lambda: sb.update_network({"allow_out": ["127.0.0.2"]}), "403", "--network")
            assert reach(sb) == ""
            sb.kill()
            """,
        )
    finally:
        none.stop()


@pytest.mark.slow
@pytest.mark.needs("slirp4netns", "tun")
def test_under_full_a_caller_narrows_to_none_or_rules_but_never_reaches_the_lan(
    upstreams: tuple[StandIn, ...], tmp_path: Path
) -> None:
    full = _server(tmp_path, "full")
    try:
        _run(
            full,
            tmp_path,
            upstreams,
            """
            # the host's loopback and LAN stay out under full: an ask for them is past it
            refused(lambda: Sandbox.create("host", network={"allow_out": ["127.0.0.2"]}), "403", "--network")
            refused(lambda: Sandbox.create("host", network={"allow_out": ["10.1.2.0/24"]}), "403", "--network")
            dark = Sandbox.create("host", allow_internet_access=False)   # a jail with no network at all
            assert dark.commands.run("echo ${HTTPS_PROXY:-none}").stdout == "none\\n"   # no proxy either
            refused(lambda: dark.update_network({}), "409", "'none'")
            dark.kill()
            ruled = Sandbox.create("host", network={"allow_out": ["example.com"], "deny_out": [ALL_TRAFFIC]})
            assert "3128" in ruled.commands.run("echo $HTTPS_PROXY").stdout        # an allow jail
            ruled.update_network({"deny_out": ["192.0.2.0/24"]})                 # widened within the mode
            ruled.kill()
            wide = Sandbox.create("host")
            refused(lambda: wide.update_network({"allow_internet_access": False}), "409", "'full'")
            wide.kill()
            """,
        )
    finally:
        full.stop()


@pytest.mark.slow
def test_a_narrowed_sandbox_kept_across_a_stop_comes_back_as_narrow(
    upstreams: tuple[StandIn, ...], tmp_path: Path
) -> None:
    """A paused sandbox kept when the server stops is served again with its caller's network, asked
    again under the next server's ``--network``: never the server's wider one, and a record whose ask
    is past a narrower ``--network`` is not served (it stays on disk)."""
    env = {"JAILBOX_CACHE_DIR": str(tmp_path / "cache")}
    flags = ["--api-key-file", str(key_file(tmp_path, KEY_A)), "--warm", "0"]
    first = start_server(tmp_path, *flags, "--network", CEILING, env=env)
    try:
        sid = _run(
            first,
            tmp_path,
            upstreams,
            """
            sb = Sandbox.create("host", network={"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]})
            sb.update_network({"allow_out": ["127.0.0.3"], "deny_out": [ALL_TRAFFIC]})
            assert reach(sb) == "3"
            sb.pause()
            print(sb.sandbox_id)
            """,
        ).strip()
    finally:
        first.stop()
    narrower = start_server(tmp_path, *flags, "--network", "allow:127.0.0.2:*", env=env)
    try:
        assert api(narrower, "GET", "/v2/sandboxes", KEY_A) == (200, [])  # its ask is past this --network
    finally:
        narrower.stop()
    assert (tmp_path / "keys.paused" / f"{sid}.json").exists()
    again = start_server(tmp_path, *flags, "--network", CEILING, env=env)
    try:
        _run(
            again,
            tmp_path,
            upstreams,
            f"""
            sb = Sandbox.connect("{sid}")
            assert reach(sb) == "3"
            sb.kill()
            """,
        )
    finally:
        again.stop()
