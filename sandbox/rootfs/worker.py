"""The unpack worker: a fresh ``python -I -S`` that works on stored trees inside the jail's id map.

Why a separate process: files in a stored tree belong to the ids the jail will see (in-image root,
``_apt``...), which rootless means subordinate host ids. Only a process that is root of a user
namespace with exactly the jail's map can create, chown or remove them. The worker unshares its
user namespace, says ``ready`` on stdout, and waits on the ``go`` descriptor while the host writes
its maps (``newuidmap``/``newgidmap``, or host root directly), then becomes the namespace's root.
Extraction always runs so, as host root too: root's jails map a subordinate range (``0 R 65536``),
so the tree is owned R.. on the host, and nothing outside that range can change through a hostile
archive. Its sources and destination are opened first, while the worker still has its host ids
(as host root the 0700 store above them is no longer searchable once it is R). As host root,
``rmtree`` and ``du`` need no namespace.

Request: one JSON object in the memfd ``argv`` names (an image's layers outgrow an argv string);
answers: JSON lines on stdout. Stdlib only. The worker dies with the process that started it
(``PR_SET_PDEATHSIG``, set again after becoming the namespace's root, which clears it, and each time
followed by a check that the parent is still the one that asked), so a killed ``pull`` or ``import``
leaves no extraction writing on.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
from typing import IO

from ..floor.tree import remove_tree
from . import untar

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1
# The worker's own memory bound (RLIMIT_DATA: its heap and private mappings, zstd's too, which
# inherits it), so a parse that escapes untar's bounds fails with MemoryError instead of taking
# the host. Room for what it legitimately holds: xz's dictionary (64 MiB at -9), zstd's default
# 128 MiB window, and untar's per-layer path sets for millions of members.
MEMORY_MAX = 1 << 30


def _say(obj: dict) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def _die_with(parent: int) -> None:
    """Be killed when ``parent`` (the thread that started us) ends; already gone: end now."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _enter_userns(go_fd: int, setgroups: bool, parent: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"creating a user namespace: {os.strerror(err)}")
    _say({"ready": True})
    if os.read(go_fd, 1) != b"1":
        os._exit(1)
    # as host root the map does not name our host ids: become the namespace's root, as the jail does
    if setgroups:
        os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    _die_with(parent)  # a change of credentials cleared it


def _open_raw(source: dict) -> IO[bytes]:
    return sys.stdin.buffer if source.get("stdin") else open(source["path"], "rb")


def _open_source(raw: IO[bytes]) -> tuple[IO[bytes], subprocess.Popen | None]:
    head = raw.peek(4)[:4] if hasattr(raw, "peek") else b""
    if head == ZSTD_MAGIC:
        if shutil.which("zstd") is None:
            raise untar.Unsafe("(layer): zstd-compressed and no zstd program; fix: apt-get install zstd")
        proc = subprocess.Popen(["zstd", "-dcq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        threading.Thread(target=_feed, args=(raw, proc.stdin), daemon=True).start()
        return proc.stdout, proc
    return raw, None


def _feed(src: IO[bytes], dst: IO[bytes]) -> None:
    """Copy what ``src`` holds (its buffer included) into the decompressor."""
    try:
        shutil.copyfileobj(src, dst, 1 << 20)
    except OSError:
        pass
    finally:
        try:
            dst.close()
        except OSError:
            pass


def extract(req: dict, raws: list[IO[bytes]]) -> dict:
    """Extract ``raws`` (the request's sources, opened) into our working directory, the tree."""
    limits = untar.ArchiveBounds(**req["limits"])
    ex = untar.Extractor(".", layer=req["layer"], max_id=req["max_id"], flatten=req["flatten"], limits=limits)
    try:
        for source, raw in zip(req["sources"], raws, strict=True):
            stream, proc = _open_source(raw)
            try:
                ex.extract(stream)
            finally:
                stream.close()
                if proc is not None and proc.wait() != 0:
                    raise untar.Unsafe(f"(layer {source.get('path')}): zstd could not decompress it")
    finally:
        ex.close()
    return {"ok": True, "entries": ex.entries, "bytes": ex.bytes, "skipped": ex.skipped[:1000]}


def du(path: str) -> dict:
    """Apparent bytes, bytes on disk and entries; hard links counted once."""
    seen: set[tuple[int, int]] = set()
    apparent = disk = entries = 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            entries += 1
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            apparent += st.st_size
            disk += st.st_blocks * 512
    return {"ok": True, "bytes": apparent, "disk": disk, "entries": entries}


def main(argv: list[str]) -> None:
    with os.fdopen(int(argv[0]), "rb") as f:
        req = json.loads(f.read())
    _die_with(req["parent"])
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    bound = MEMORY_MAX if hard == resource.RLIM_INFINITY else min(MEMORY_MAX, hard)  # may only lower
    resource.setrlimit(resource.RLIMIT_DATA, (bound, bound))
    try:
        os.umask(0o022)
        raws: list[IO[bytes]] = []
        if req["op"] == "extract":
            raws = [_open_raw(source) for source in req["sources"]]
            os.chdir(req["dest"])
        if req["userns"]:
            _enter_userns(req["go_fd"], req["setgroups"], req["parent"])
        if req["op"] == "extract":
            _say(extract(req, raws))
        elif req["op"] == "rmtree":
            remove_tree(req["path"])
            _say({"ok": True})
        elif req["op"] == "du":
            _say(du(req["path"]))
        else:
            _say({"ok": False, "error": f"unknown op {req['op']!r}"})
    except untar.Unsafe as exc:
        _say({"ok": False, "unsafe": True, "error": str(exc)})
    except untar.Failed as exc:
        _say({"ok": False, "error": str(exc)})
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group: the host cleans up
        os._exit(130)
    except Exception as exc:
        _say({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
