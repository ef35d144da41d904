"""``jailbox serve`` itself: load or make the API key, hold the sandboxes, serve until stopped.

Runs in the serving host process. On SIGINT or SIGTERM it stops taking requests and closes every
sandbox it holds, so no jail outlives the server; a paused one is kept first, as a snapshot and a
record beside the key file, and served paused again by the next server with that key file
(``dormant.py``).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from .. import keys
from ..listen import refused
from . import dormant
from .control import ControlPlane
from .httpd import Server
from .ports import Relay
from .registry import Registry, Shape

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def run(
    host: str,
    port: int,
    api_key_file: Path | None,
    max_sandboxes: int,
    max_per_key: int,
    default_timeout: int,
    max_timeout: int,
    warm: int,
    verbose: bool,
    shape: Shape,
) -> None:
    path, key = keys.given_or_made(api_key_file, keys.SERVE_KEYS)
    if key is not None:
        print(f"jailbox serve: made an API key in {path} (shown only now): {key}", file=sys.stderr)
    loaded = keys.load(path)
    try:
        paused = dormant.directory(path)
    except (dormant.DormantError, OSError) as exc:
        raise keys.KeyFileError(f"--api-key-file {path}: {exc}") from None
    owners = {keys.owner_of(k) for k in loaded}
    registry = Registry(max_sandboxes, max_per_key, default_timeout, max_timeout, warm, shape, paused, owners)
    try:
        plane = ControlPlane(keys.Keys(loaded), registry)
        server = Server((host, port), plane, plane.tenant, verbose, Relay(registry))
        plane.domain = f"localhost:{server.server_address[1]}"  # get_host's <port>-<id>.localhost:PORT
    except OSError as exc:
        registry.close()
        raise refused(host, port, exc) from None
    except BaseException:
        registry.close()
        raise
    url = f"http://{host if ':' not in host else f'[{host}]'}:{server.server_address[1]}"
    print(
        f"jailbox serve: listening on {url}\n"
        f"  export E2B_API_URL={url} E2B_SANDBOX_URL={url} E2B_HTTP_VERSION=1.1 E2B_API_KEY=<a key from {path}>",
        file=sys.stderr,
        flush=True,
    )

    if host not in LOOPBACK:
        print(
            f"jailbox serve: {host} is not loopback: keys and tokens travel in plain HTTP; put TLS in front "
            "(SECURITY.md: jailbox serve)",
            file=sys.stderr,
        )

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        registry.close()
