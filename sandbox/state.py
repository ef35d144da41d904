"""Per-user state directory: skeletons and one directory per live sandbox.

Each sandbox directory holds ``meta.json`` (owner pid and start tick, init pid and start tick) so
``jailbox cleanup`` can tell a live sandbox from the remains of a crashed host process. A closed
sandbox's directory waits in ``trash/`` while its host removes it (``removal.py``).
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

from .child.protocol import TRASH, Failed, Removed, RmtreeRequest, decode
from .errors import ConfigError, SandboxSetupError
from .floor.idmap import IdMap
from .floor.procstat import start_ticks
from .floor.tree import remove_tree
from .floor.wire import WireError
from .launcher import LAUNCHER, REMOVE_TIMEOUT

_READY: set[Path] = set()


def state_dir(override: Path | None = None) -> Path:
    if override is not None:
        base = Path(override)
    elif os.environ.get("JAILBOX_STATE_DIR"):
        base = Path(os.environ["JAILBOX_STATE_DIR"])
    else:
        xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        base = Path(xdg) / "jailbox"
    if base not in _READY:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        _check_private(base)
        for sub in ("sandboxes", "stage", TRASH):
            (base / sub).mkdir(exist_ok=True, mode=0o700)
        _READY.add(base)
    return base


def trash_dir(base: Path) -> Path:
    return base / TRASH


def _check_private(base: Path) -> None:
    """The state directory holds what becomes each jail's /etc and its writable layers: another user
    who owns it, or may write in it, could plant files in every jail (an ld.so.preload). Never chmod
    or chown it here: it may be a directory someone named by mistake."""
    st = base.stat()
    fix = "set JAILBOX_STATE_DIR to a directory of your own (e.g. ~/.local/state/jailbox)"
    if st.st_uid != os.getuid():
        raise ConfigError(f"state directory {base} belongs to uid {st.st_uid}, not to you; {fix}")
    if st.st_mode & 0o022:
        raise ConfigError(
            f"state directory {base} is writable by other users (mode {oct(st.st_mode & 0o777)}); "
            f"chmod go-w {base}, or {fix}"
        )


@functools.lru_cache(maxsize=64)
def _cached_start(pid: int) -> int | None:
    return start_ticks(pid)


def own_start() -> int | None:
    """This process's start, as ``meta.json`` and the counters ledger record an owner: clock ticks since
    boot, which a step of the wall clock (NTP, a VM resumed) leaves alone. A time in seconds since the
    epoch (boot time plus ticks) moves with such a step, and a live owner then looked dead."""
    return _cached_start(os.getpid())


def started_as(pid: object, start: object) -> bool:
    """Whether ``pid`` is the process that started at ``start`` (ticks since boot), not another one that
    was given its pid since."""
    return isinstance(pid, int) and isinstance(start, int) and start_ticks(pid) == start


def write_meta(sandbox_dir: Path, **fields: object) -> None:
    tmp = sandbox_dir / "meta.json.tmp"
    tmp.write_text(json.dumps({"created": time.time(), **fields}))
    os.replace(tmp, sandbox_dir / "meta.json")


def read_meta(sandbox_dir: Path) -> dict:
    try:
        meta = json.loads((sandbox_dir / "meta.json").read_text())
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


def owner_alive(meta: dict) -> bool:
    return started_as(meta.get("host_pid"), meta.get("host_start"))


def remove_sandbox_dir(sandbox_dir: Path, id_map: IdMap | None) -> None:
    """Remove a sandbox's directory; files its jail left under subordinate ids are removed by the
    launcher, as root of a user namespace with the jail's map."""
    try:
        remove_tree(sandbox_dir)
    except OSError:
        if id_map is None or not id_map.helper:
            raise
        reply, _ = LAUNCHER.request(RmtreeRequest(str(sandbox_dir), id_map).to_wire(), 0, REMOVE_TIMEOUT)
        try:
            removed = decode(reply, Removed)
        except WireError as exc:
            raise SandboxSetupError(f"could not remove {sandbox_dir}: bad launcher reply: {exc}") from None
        if isinstance(removed, Failed):
            raise SandboxSetupError(f"could not remove {sandbox_dir}: {removed.error}") from None
        if not (isinstance(removed, Removed) and removed.done):
            raise SandboxSetupError(f"could not remove {sandbox_dir}: {sandbox_dir} is still there") from None


def _meta_idmap(meta: dict) -> IdMap | None:
    """The id map a sandbox's meta.json recorded (None if it has none we can read)."""
    try:
        return IdMap.from_wire(meta["idmap"]) if "idmap" in meta else None
    except WireError:
        return None


META_GRACE = 120.0


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


def cleanup(base: Path, force: bool = False) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Kill and remove sandboxes whose host process is gone, and closed ones their host did not
    finish removing. Returns (removed, failed)."""
    removed: list[Path] = []
    failed: list[tuple[Path, str]] = []
    trash = trash_dir(base)
    for path in sorted(trash.iterdir()) if trash.is_dir() else []:
        meta = read_meta(path)
        # a live owner's remover has it in hand (and may have removed its meta.json already)
        if not force and (owner_alive(meta) or (not meta and _younger_than(path, META_GRACE))):
            continue
        try:
            remove_sandbox_dir(path, _meta_idmap(meta))
            removed.append(path)
        except Exception as exc:
            failed.append((path, str(exc)))
    for path in sorted((base / "sandboxes").iterdir()):
        meta = read_meta(path)
        if not force and (owner_alive(meta) or (not meta and _younger_than(path, META_GRACE))):
            continue  # in use, or being created right now (its meta is written once it is up)
        init_pid = meta.get("init_pid")
        if isinstance(init_pid, int) and started_as(init_pid, meta.get("init_start")):
            try:
                os.kill(init_pid, 9)
            except OSError:
                pass
        try:
            remove_sandbox_dir(path, _meta_idmap(meta))
            removed.append(path)
        except Exception as exc:  # report every leftover, keep going
            failed.append((path, str(exc)))
    return removed, failed
