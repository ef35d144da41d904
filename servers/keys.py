"""The secrets local servers take from their clients: ``jailbox serve``'s API keys, ``jailbox mcp
--http``'s bearer tokens and ``jailbox openenv``'s URL tokens; the files that hold them, made on first
start, and the check of a key.

Runs in the serving host process. A key file is one key per line (for ``jailbox serve`` each key is a
tenant: it sees only the sandboxes it made). It is opened without following a link, must be a regular
file of the serving user that nobody else may read, and is read up to ``MAX_FILE`` bytes: the keys
are what keeps every other local user (and every network peer) from running commands as this one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from ..sandbox.errors import ServerError

MAX_FILE = 64 << 10
MIN_KEY = 16
PREFIX = "jbx_"
SERVE_KEYS = "serve-api-keys"  # the default files' names, in the user's config directory
MCP_TOKENS = "mcp-token"
OPENENV_TOKENS = "openenv-token"


class KeyFileError(ServerError):
    """The key file cannot be used; the message names the file and the fix."""


def default_path(name: str) -> Path:
    """``$XDG_CONFIG_HOME/jailbox/NAME`` (``~/.config`` when unset)."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "jailbox" / name


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(30)


def create(path: Path) -> str:
    """Write a new key to ``path`` (which must not exist yet), mode 0600, and return it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = new_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def given_or_made(given: Path | None, name: str) -> tuple[Path, str | None]:
    """The key file to load: ``given``, else the default file ``name``, made now if it does not exist yet
    (then its new key is returned too, for the server to show once)."""
    if given is not None:
        return given, None
    path = default_path(name)
    return path, None if path.exists() else create(path)


def load(path: Path, flag: str = "--api-key-file") -> list[str]:
    """The keys in ``path``: a regular file of this user, unreadable to others, holding at least one key.
    A refusal names ``flag``, the option that gives the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise KeyFileError(f"{flag} {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{flag} {path}: not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise KeyFileError(
                f"{flag} {path}: must be yours and private to you (chmod 600 {path}; now mode "
                f"{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid})"
            )
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise KeyFileError(f"{flag} {path}: larger than {MAX_FILE} bytes")
    keys = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    short = [k for k in keys if len(k) < MIN_KEY]
    if short or not keys:
        raise KeyFileError(f"{flag} {path}: one key a line, each at least {MIN_KEY} characters (e.g. {new_key()})")
    return keys


def owner_of(key: str) -> str:
    """The tenant name a key stands for in the server's tables (a digest: keys are not kept around)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class Keys:
    """Checks a presented key against the loaded ones in time independent of where they differ."""

    def __init__(self, keys: list[str]) -> None:
        self._digests = {hashlib.sha256(k.encode()).digest(): owner_of(k) for k in keys}

    def owner(self, presented: str | None) -> str | None:
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode(errors="replace")).digest()
        found = None
        for known, owner in self._digests.items():
            if hmac.compare_digest(known, digest):
                found = owner
        return found
