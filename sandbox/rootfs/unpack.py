"""Host side of unpacking: run the worker (``sandbox/rootfs/worker.py``) inside the jail's id map.

API (all raise ``UnsafeArchive`` naming the member for a refused member, ``RootfsError`` otherwise):

- ``extract_tar(stream, dest)``: a plain tar stream (a rootfs tarball, ``mmdebstrap ... -`` on
  stdout) into the existing directory ``dest``. ``stream`` is a binary file object; one with a real
  descriptor (a pipe, a file) is handed to the worker as its stdin, anything else is pumped in.
  Compression (gzip, xz, bzip2, zstd) is detected.
- ``extract_layers(paths, dest)``: OCI/Docker layer blobs in order, with whiteouts.
- ``rmtree(path)``, ``du(path)``: for trees owned by subordinate ids.

Owners: files get the archive's ids as the jail will see them (up to ``IdMap.max_id`` of the
jail's default map, ``hostids.plan("auto")``). Without subordinate ids (a single-id map)
everything belongs to the user, i.e. to root inside. As host root the extraction runs in that map
too (``0 R 65536``): the tree, its top directory included, is owned R.. on the host. See ``untar``
for what is refused and why setuid bits are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from .. import hostids
from ..errors import RootfsError, UnsafeArchive
from ..floor import boot
from ..floor.idmap import IdMap, write_maps
from ..limits import IMAGE_ENTRIES_MAX, IMAGE_MEMBER_MAX, IMAGE_TOTAL_MAX


def jail_map() -> IdMap:
    """The id map of a default jail (``idmap="auto"``): what stored trees are owned for."""
    return hostids.plan("auto")


def extract_tar(
    stream: IO[bytes],
    dest: str | Path,
    *,
    max_member: int = IMAGE_MEMBER_MAX,
    max_total: int = IMAGE_TOTAL_MAX,
    max_entries: int = IMAGE_ENTRIES_MAX,
) -> dict:
    """Extract a plain tar stream into ``dest``; returns ``{"entries", "bytes", "skipped"}``."""
    limits = {"max_member": max_member, "max_total": max_total, "max_entries": max_entries}
    return _extract([{"stdin": True}], dest, layer=False, limits=limits, stream=stream)


def extract_layers(
    paths: Sequence[str | Path],
    dest: str | Path,
    *,
    max_member: int = IMAGE_MEMBER_MAX,
    max_total: int = IMAGE_TOTAL_MAX,
    max_entries: int = IMAGE_ENTRIES_MAX,
) -> dict:
    """Apply image layers (compressed or not) in order onto ``dest``, whiteouts included."""
    limits = {"max_member": max_member, "max_total": max_total, "max_entries": max_entries}
    return _extract([{"path": str(p)} for p in paths], dest, layer=True, limits=limits, stream=None)


def rmtree(path: str | Path) -> None:
    """Remove a tree whose files may belong to subordinate ids."""
    if not os.path.lexists(path):
        return
    run({"op": "rmtree", "path": str(Path(path).absolute())})
    if os.path.lexists(path):
        raise RootfsError(f"could not remove {path}")


def du(path: str | Path) -> dict:
    """``{"bytes": apparent size, "disk": bytes allocated, "entries": n}`` of a stored tree."""
    return run({"op": "du", "path": str(Path(path).absolute())})


def _extract(sources: list[dict], dest: str | Path, layer: bool, limits: dict, stream: IO[bytes] | None) -> dict:
    plan = jail_map()
    top = plan.max_id()
    if os.getuid() == 0:  # the tree is the jail's /: its root's, and writable by the worker as that root
        os.chown(dest, *plan.host_root(), follow_symlinks=False)
    req = {
        "op": "extract",
        "dest": str(Path(dest).absolute()),
        "sources": sources,
        "layer": layer,
        "max_id": top,
        "flatten": top == 0,
        "limits": limits,
    }
    return run(req, stream=stream, plan=plan)


def run(req: dict, stream: IO[bytes] | None = None, plan: IdMap | None = None) -> dict:
    """Run one worker request in the jail's namespace; its answer, or raise.

    The request reaches the worker in a memfd, not its argv, whose one string the kernel caps at 128 KiB
    (an image's layer paths would not fit). The worker dies with this process (``PR_SET_PDEATHSIG``):
    this thread waits for it, so the thread that made it outlives it unless the process dies."""
    plan = plan or jail_map()
    userns = os.getuid() != 0 or req["op"] == "extract"
    go_r, go_w = os.pipe()
    req_fd = os.memfd_create("jailbox-worker-request", os.MFD_CLOEXEC)
    req = {**req, "userns": userns, "go_fd": go_r, "setgroups": not plan.deny_setgroups, "parent": os.getpid()}
    os.write(req_fd, json.dumps(req).encode())
    os.lseek(req_fd, 0, os.SEEK_SET)
    stdin: Any = subprocess.DEVNULL
    pump = None
    if stream is not None:
        stdin = _fd_of(stream)
        if stdin is None:
            stdin = subprocess.PIPE
    try:
        proc = subprocess.Popen(
            boot.command("sandbox.rootfs.worker", str(req_fd), req["op"]),
            stdin=stdin,
            stdout=subprocess.PIPE,
            pass_fds=[go_r, req_fd],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,  # a terminal's Ctrl-C is ours to handle (we kill it), and not the rmtree's after it
        )
    finally:
        os.close(go_r)
        os.close(req_fd)
    assert proc.stdout is not None
    try:
        if userns:
            first = _answer(proc)
            if not first.get("ready"):
                raise RootfsError(first.get("error", "the unpack worker could not enter a user namespace"))
            _write_maps(proc.pid, plan)
            os.write(go_w, b"1")
        if stdin is subprocess.PIPE:
            assert stream is not None
            pump = threading.Thread(target=_pump, args=(stream, proc), daemon=True)
            pump.start()
        reply = _answer(proc)
    except BaseException:
        proc.kill()
        raise
    finally:
        os.close(go_w)
        proc.wait()
        proc.stdout.close()
        if pump is not None:
            pump.join()
    if not reply.get("ok"):
        cls = UnsafeArchive if reply.get("unsafe") else RootfsError
        raise cls(str(reply.get("error", "the unpack worker failed"))[:4000])
    return reply


def _answer(proc: subprocess.Popen) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline(1 << 20)
    if not line:
        proc.wait()
        raise RootfsError(f"the unpack worker exited (status {proc.returncode}) without an answer")
    return json.loads(line)


def _write_maps(pid: int, plan: IdMap) -> None:
    try:
        write_maps(pid, plan)
    except OSError as exc:
        raise RootfsError(f"writing the unpack worker's id map: {exc.strerror or exc}") from None


def _fd_of(stream: IO[bytes]) -> int | None:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    if hasattr(stream, "peek") or hasattr(stream, "tell"):
        try:
            if stream.seekable() and stream.tell() != os.lseek(fd, 0, os.SEEK_CUR):
                return None  # buffered ahead of the descriptor: pump what the object holds
        except OSError:
            pass
    return fd


def _pump(stream: IO[bytes], proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    try:
        shutil.copyfileobj(stream, proc.stdin, 1 << 20)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
