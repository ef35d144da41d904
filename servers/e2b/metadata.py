"""File metadata as envd keeps it: ``user.e2b.<key>`` extended attributes, set on upload from the
``X-Metadata-<key>`` headers (``files.write(metadata=...)``) and shown in entries.

Runs in the serving host process; the attributes are read and written in the jail, as the request's
user, by a small stdlib Python program (``PROGRAM``) given the paths in its argv, so the host never
resolves a path the jail made. Keys are lowercased; keys and values are printable ASCII, at most
``MAX_TOTAL`` bytes a file together (envd's bounds). What the program prints is untrusted: JSON
bounded by the sandbox's output limit, checked field by field, and values that are not printable
ASCII are left out. A sandbox's entries carry metadata once an upload has set some in it (reading
attributes costs a program run a request); a tree without ``python3`` cannot hold metadata, and an
upload asking for it is refused naming why.
"""

from __future__ import annotations

import json
import re

from ...sandbox import Sandbox
from ...sandbox.errors import SandboxError
from .fs import RESOLVE_BATCH, FsError

PREFIX = "user.e2b."
HEADER = "x-metadata-"
MAX_TOTAL = 4096
MAX_KEY = 255 - len(PREFIX)
PRINTABLE = re.compile(r"^[\x20-\x7e]*$")
TIMEOUT = 60.0

PROGRAM = r"""
import json, os, sys
prefix, mode, wanted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
for path in sys.argv[4:]:
    try:
        names = [n for n in os.listxattr(path, follow_symlinks=False) if n.startswith(prefix)]
        if mode == "set":
            for n in names:
                if n[len(prefix):] not in wanted:
                    os.removexattr(path, n, follow_symlinks=False)
            for k, v in wanted.items():
                os.setxattr(path, prefix + k, v.encode(), follow_symlinks=False)
        else:
            got = {}
            for n in names:
                try:
                    got[n[len(prefix):]] = os.getxattr(path, n, follow_symlinks=False).decode()
                except (OSError, UnicodeDecodeError):
                    pass
            if got:
                out[path] = got
    except OSError as exc:
        if mode == "set":
            sys.exit(f"{path}: {exc.strerror}")
print(json.dumps(out))
"""


def from_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
    """The metadata an upload's ``X-Metadata-*`` headers ask for, checked as envd checks it."""
    found: dict[str, str] = {}
    for name, value in headers:
        if not name.lower().startswith(HEADER):
            continue
        key = name[len(HEADER) :].lower()
        if not key:
            continue
        if len(key) > MAX_KEY or not PRINTABLE.match(key) or not PRINTABLE.match(value):
            raise FsError(
                "invalid_argument", f"metadata key {key[:40]!r}: keys and values are printable ASCII, keys <= {MAX_KEY}"
            )
        found[key] = value
    if sum(len(PREFIX) + len(k) + len(v) for k, v in found.items()) > MAX_TOTAL:
        raise FsError("invalid_argument", f"the metadata is over {MAX_TOTAL} bytes")
    return found


def _run(sb: Sandbox, mode: str, wanted: dict[str, str], paths: list[str], user: str | None) -> bytes:
    argv = ["python3", "-I", "-S", "-c", PROGRAM, PREFIX, mode, json.dumps(wanted), *paths]
    try:
        r = sb.exec(argv, timeout=TIMEOUT, user=user)
    except SandboxError as exc:
        raise FsError("unavailable", f"the sandbox could not handle file metadata: {exc}") from None
    if r.exit_code == 127:
        raise FsError("failed_precondition", "file metadata needs python3 in the sandbox's root filesystem")
    if r.exit_code != 0:
        err = r.stderr_bytes.decode(errors="replace").strip()[-300:]
        raise FsError("permission_denied" if "ermission" in err else "internal", f"cannot set file metadata: {err}")
    if r.stdout_dropped:
        raise FsError("resource_exhausted", "the files' metadata is over the sandbox's output limit")
    return r.stdout_bytes


def write(sb: Sandbox, paths: list[str], wanted: dict[str, str], user: str | None) -> None:
    """Make ``wanted`` each path's whole metadata (other ``user.e2b.*`` attributes are removed)."""
    for start in range(0, len(paths), RESOLVE_BATCH):
        _run(sb, "set", wanted, paths[start : start + RESOLVE_BATCH], user)


def read(sb: Sandbox, paths: list[str], user: str | None) -> dict[str, dict[str, str]]:
    """The metadata of each of ``paths`` that has some."""
    found: dict[str, dict[str, str]] = {}
    for start in range(0, len(paths), RESOLVE_BATCH):
        batch = paths[start : start + RESOLVE_BATCH]
        try:
            answer = json.loads(_run(sb, "get", {}, batch, user))
        except (ValueError, RecursionError):
            raise FsError("internal", "the jail's metadata listing is malformed") from None
        if not isinstance(answer, dict):
            raise FsError("internal", "the jail's metadata listing is malformed")
        for path in batch:
            got = answer.get(path)
            if isinstance(got, dict):
                found[path] = {
                    k: v
                    for k, v in got.items()
                    if isinstance(k, str) and isinstance(v, str) and PRINTABLE.match(k) and PRINTABLE.match(v)
                }
    return found
