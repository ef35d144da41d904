"""``jailbox serve``'s signed file URLs and metrics, driven by the unmodified E2B SDK.

The server runs as a subprocess on loopback; the SDK runs in a fresh interpreter and the URLs it
signs are fetched by a plain HTTP client, as a browser or ``curl`` given one would. Real jails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_serve_e2b import KEY_A, KEY_B, Served, _sdk, key_file, sdk, start_server


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
