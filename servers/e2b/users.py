"""Whom a served sandbox's daemon request runs as: E2B's user model.

Runs in the serving host process, on a request's thread. The SDK names a user (``user=``) in the
``Authorization: Basic`` header (``<name>:``, no password), as envd reads it; without one a request
runs as the sandbox's own user: ``user`` (uid 1000, home ``/home/user``) for E2B's ``base``
template when the server has the ``e2b-base`` tree, else the template's. A name is looked up in the
sandbox's root filesystem (``/etc/passwd`` of its tree, as ``SandboxConfig.user`` is) the first
time a sandbox is asked for it; one it lacks is refused as envd refuses it (unauthenticated), and
for ``user`` the refusal says how to build a tree that has it. An upload is written by the host and
then given to the user it was made for (``give``).
"""

from __future__ import annotations

import base64
import binascii
import re

from ...sandbox.errors import ConfigError, SandboxError
from .connect import RpcError
from .httpd import Request
from .registry import E2B_TEMPLATE, E2B_USER, Served

NAME = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})$")
MAX_HEADER = 256
BUILD_HINT = f"build a tree with it: jailbox rootfs build {E2B_TEMPLATE} (E2B's base template then uses it)"
LOOKUP_TIMEOUT = 30.0
BASIC = 'Authorization must be Basic with a user name, e.g. user="root"'


def requested(served: Served, request: Request, named: str | None = None) -> str | None:
    """The user a request names (``named``: as ``/files`` does, by ``?username=``; else by its
    ``Authorization``), checked against the sandbox's tree; None: the sandbox's own."""
    header = request.header("Authorization")
    name = named
    if name is None and header:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic" or len(token) > MAX_HEADER:
            raise RpcError("unauthenticated", BASIC)
        try:
            name = base64.b64decode(token, validate=True).decode("ascii").partition(":")[0]
        except (binascii.Error, UnicodeDecodeError):
            raise RpcError("unauthenticated", BASIC) from None
    if not name or name == served.user:
        return None
    if not NAME.match(name):
        raise RpcError("unauthenticated", f'invalid username {name[:40]!r}: a name or uid, e.g. user="root"')
    if name not in served.users_seen:
        try:
            served.sandbox.exec(["true"], user=name, timeout=LOOKUP_TIMEOUT)
        except ConfigError:
            hint = f"; {BUILD_HINT}" if name == E2B_USER else ""
            raise RpcError(
                "unauthenticated", f"invalid username {name!r}: not a user of this sandbox's root filesystem{hint}"
            ) from None
        except SandboxError as exc:
            raise RpcError("unavailable", f"the sandbox stopped: {exc}") from None
        served.users_seen.add(name)
    return name


def give(served: Served, user: str | None, paths: list[str]) -> None:
    """Make ``paths`` (just uploaded, by the host as root) the requesting user's, as envd does after
    an upload: ``chown`` in the jail, as root, not following a link at the end."""
    name = user or served.user
    if name in ("root", "0") or not paths:
        return
    try:
        r = served.sandbox.exec(["chown", "-h", "--", f"{name}:", *paths], timeout=LOOKUP_TIMEOUT, user="root")
    except SandboxError as exc:
        raise RpcError("unavailable", f"the sandbox stopped: {exc}") from None
    if r.exit_code != 0:
        raise RpcError(
            "internal", f"cannot give the upload to {name}: {r.stderr_bytes.decode(errors='replace')[-300:]}"
        )
