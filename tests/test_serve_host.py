"""``jailbox serve``'s signed file URLs and metrics, driven by the unmodified E2B SDK.

The server runs as a subprocess on loopback; the SDK runs in a fresh interpreter and the URLs it
signs are fetched by a plain HTTP client, as a browser or ``curl`` given one would. Real jails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_serve_e2b import KEY_A, KEY_B, Served, _sdk, api, key_file, sdk, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    _sdk()
    tmp = tmp_path_factory.mktemp("signed")
    served = start_server(tmp, "--api-key-file", str(key_file(tmp, KEY_A, KEY_B)), "--max-per-key", "6")
    yield served
    served.stop()
    assert "Traceback" not in "".join(served.log), "".join(served.log)


def test_signed_urls_open_only_what_they_were_signed_for(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        import urllib.parse

        import httpx
        from e2b import Sandbox
        from e2b.sandbox.signature import get_signature

        sb = Sandbox.create(template="host", secure=True)
        other = Sandbox.create(template="host", secure=True)
        sb.files.write("/tmp/a.txt", "secret a")
        sb.files.write("/tmp/b.txt", "secret b")
        other.files.write("/tmp/a.txt", "other a")

        def get(url):
            return httpx.get(url, timeout=30)

        def put(url, data):
            return httpx.post(url, files={"file": ("x", data)}, timeout=30)

        def with_query(url, **changes):
            parts = urllib.parse.urlsplit(url)
            query = dict(urllib.parse.parse_qsl(parts.query))
            query.update(changes)
            return parts._replace(query=urllib.parse.urlencode(query)).geturl()

        # signed URLs, with and without an expiry, download and upload through no header at all
        for expiry in (None, 60):
            r = get(sb.download_url("/tmp/a.txt", use_signature_expiration=expiry))
            assert (r.status_code, r.text) == (200, "secret a"), (r.status_code, r.text)
        r = put(sb.upload_url("/tmp/up.txt", use_signature_expiration=60), b"uploaded")
        assert r.status_code == 200, (r.status_code, r.text)
        assert sb.files.read("/tmp/up.txt") == "uploaded"
        r = get(other.download_url("/tmp/a.txt"))  # the signature finds its own sandbox
        assert (r.status_code, r.text) == (200, "other a"), (r.status_code, r.text)

        # each way of reusing a signature for something else is 401, as envd answers it
        read_a = sb.download_url("/tmp/a.txt", use_signature_expiration=60)
        write_a = sb.upload_url("/tmp/a.txt", use_signature_expiration=60)
        base = read_a.split("?")[0]
        refused = {
            "bare": get(base + "?path=/tmp/a.txt"),
            "another path": get(with_query(read_a, path="/tmp/b.txt")),
            "another user": get(with_query(read_a, username="root")),
            "a later expiry": get(with_query(read_a, signature_expiration=str(int(time.time()) + 3600))),
            "no expiry": get(read_a.split("&signature_expiration")[0]),
            "read as write": put(read_a, b"overwritten"),
            "write as read": get(write_a),
            "expired": get(sb.download_url("/tmp/a.txt", use_signature_expiration=-10)),
            "malformed": get(with_query(read_a, signature="v1_" + "A" * 43)),
            "bad expiry": get(with_query(read_a, signature_expiration="soon")),
        }
        for why, r in refused.items():
            assert r.status_code == 401, (why, r.status_code, r.text)
            assert "Traceback" not in r.text and r.json()["message"], (why, r.text)
        assert refused["expired"].json()["message"] == "signature is already expired"
        assert sb.files.read("/tmp/a.txt") == "secret a"  # the refused upload wrote nothing

        # the other sandbox's token signs nothing of this one's
        forged = get_signature("/tmp/a.txt", "read", None, other._envd_access_token)
        r = get(with_query(read_a.split("&signature_expiration")[0], signature=forged["signature"]))
        assert (r.status_code, r.text) == (200, "other a"), (r.status_code, r.text)
        # a sandbox named by the SDK's host form is held to its own token
        host = {"Host": f"49983-{sb.sandbox_id}.localhost"}
        r = httpx.get(with_query(base + "?path=/tmp/a.txt", signature=forged["signature"]), headers=host)
        assert r.status_code == 401, (r.status_code, r.text)

        # a killed sandbox's URLs open nothing
        url = sb.download_url("/tmp/a.txt")
        sb.kill()
        assert get(url).status_code == 401
        other.kill()
        """,
    )


def test_metrics_are_the_sandboxs_use_now_in_e2bs_shape(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import datetime, time
        from e2b import Sandbox, SandboxException, SandboxNotFoundException

        sb = Sandbox.create(template="host")
        sb.commands.run("python3 -c 'import time; x = bytearray(96 << 20); time.sleep(30)' &")
        sb.commands.run("head -c 16000000 /dev/zero > /big; timeout 1 sh -c 'while :; do :; done'; true")
        time.sleep(0.3)
        for _ in range(100):  # the writable layer is walked by the watcher, a little at a time
            (m,) = sb.get_metrics()
            if m.disk_used >= 16_000_000:
                break
            time.sleep(0.1)
        assert m.cpu_count >= 1 and 0 < m.cpu_used_pct <= 100, m
        assert m.mem_used >= 96 << 20 and m.mem_total == 2 << 30, m
        assert 16_000_000 <= m.disk_used < m.disk_total == 4 << 30, m
        assert abs(m.timestamp.timestamp() - time.time()) < 30, m

        (again,) = Sandbox.get_metrics(sb.sandbox_id)  # the class form, by id
        assert again.mem_total == m.mem_total
        now = datetime.datetime.now(datetime.timezone.utc)
        assert sb.get_metrics(start=now - datetime.timedelta(hours=1), end=now) != []
        assert sb.get_metrics(end=now - datetime.timedelta(hours=1)) == []  # no history is kept
        assert sb.get_metrics(start=now + datetime.timedelta(hours=1)) == []

        other = Sandbox.get_metrics  # another key's sandbox, and one that never was, are not found
        for missing in ("nosuch", sb.sandbox_id):
            key = "jbx_" + "b" * 40 if missing == sb.sandbox_id else None
            try:
                other(missing, api_key=key) if key else other(missing)
                raise AssertionError(f"metrics of {missing} were given")
            except SandboxNotFoundException:
                pass
        sb.kill()
        """,
    )


def test_a_bad_metrics_window_is_named(server: Served) -> None:
    status, made = api(server, "POST", "/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201 and isinstance(made, dict), made
    try:
        for query in ("start=soon", "end=1e9", "start=" + "9" * 40):
            status, body = api(server, "GET", f"/sandboxes/{made['sandboxID']}/metrics?{query}", KEY_A)
            name = query.split("=")[0]
            assert status == 400 and f"{name} must be Unix seconds" in body["message"], (query, status, body)
    finally:
        api(server, "DELETE", f"/sandboxes/{made['sandboxID']}", KEY_A)
