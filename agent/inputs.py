"""A task's ``@path`` input files: host files beneath one inputs root, found without following any symlink.

A tasks file is data, so the host files it may hand a jail are bounded by a root the user chose (the tasks
file's directory, or ``--inputs-root``): a path is relative, has no ``..``, and is walked one component at a
time from the root's descriptor with ``O_NOFOLLOW``, so neither a ``..``, an absolute path nor a symlink
anywhere on the way (one planted inside the root pointing out included) reaches a file outside it.
``check`` reads the text alone (the driver calls it before anything runs); ``open_beneath`` walks the
filesystem where the task runs (a driver thread, or a Ray worker on whichever node runs it). Symlinks inside
an input directory are copied into the jail as links, never read through (that is ``Sandbox.put``'s rule).

``copy_dir`` is ``jailbox run``'s and ``jailbox replay``'s ``--input_dir``: the whole directory copied into the
jail's writable layer, as the reference copies it, so the model may change or add files there. It is the
user's data, not the jail's, but the copy is still bounded: the tree is first walked by descriptor without
following any link (``hostfs.read_source``), and one holding a FIFO, socket or device (a copy would block on it
or read forever), more than ``INPUT_LIMIT`` bytes or more than ``INPUT_ENTRIES`` entries is refused before
anything is copied. Another jail may be writing the directory meanwhile (a read-write bind of it): the copy
walks it the same way and is held to the same bounds, so it never reads through a link swapped in.
"""

from __future__ import annotations

import os
import stat
from contextlib import closing
from pathlib import Path

from ..sandbox import Sandbox, hostfs
from ..sandbox.errors import AgentError, SandboxFileError

PREFIX = "@"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ANY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
INPUT_LIMIT = 1 << 30
"""Bytes of regular files an input directory may hold: each is copied into the jail's writable layer."""
INPUT_ENTRIES = 100_000
"""Files, directories and links an input directory may hold."""


class InputError(AgentError, ValueError):
    """An input file refused; the message is one line naming the task and the field."""

    def __init__(self, task_id: str, jail_path: str, why: str) -> None:
        super().__init__(f"task {task_id!r}: input_files[{jail_path!r}]: {why}")


def check(task_id: str, jail_path: str, value: str) -> list[str]:
    """The components of ``value``'s host path if it is an ``@path`` (none for inline text), or InputError."""
    if not value.startswith(PREFIX):
        return []
    rel = value[len(PREFIX) :]
    if not rel:
        raise InputError(task_id, jail_path, "'@' names no file")
    if "\0" in rel:
        raise InputError(task_id, jail_path, f"{value!r} has a NUL byte")
    if rel.startswith("/"):
        raise InputError(task_id, jail_path, f"{value!r} is absolute; name a path beneath the inputs root")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InputError(task_id, jail_path, f"{value!r} has '..'; name a path beneath the inputs root")
    return parts


def open_beneath(root: Path | None, task_id: str, jail_path: str, value: str) -> int:
    """A descriptor of ``value``'s file or directory beneath ``root``, no symlink followed; the caller closes it."""
    parts = check(task_id, jail_path, value)
    if root is None:
        raise InputError(task_id, jail_path, f"{value!r} needs an inputs root, and none was given")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(task_id, jail_path, f"the inputs root {str(root)!r}: {exc.strerror}") from None
    try:
        for position, part in enumerate(parts):
            last = position == len(parts) - 1
            try:
                nfd = os.open(part, _ANY if last else _DIR, dir_fd=fd)
            except OSError as exc:
                why = "is a symlink, which is not followed" if _is_link(fd, part) else exc.strerror
                raise InputError(task_id, jail_path, f"{value!r}: {'/'.join(parts[: position + 1])} {why}") from None
            os.close(fd)
            fd = nfd
        kind = os.fstat(fd).st_mode
        if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
            raise InputError(task_id, jail_path, f"{value!r} is not a regular file or directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


class InputDirError(AgentError, ValueError):
    """An input directory refused; the message is one line naming the directory and what to do."""


def copy_dir(sb: Sandbox, src: Path, dst: str, limit: int = INPUT_LIMIT) -> None:
    """The tree ``src`` copied to ``dst`` in the jail, writable there, links kept as links; InputDirError
    (before anything is copied) for a tree over ``limit`` bytes or ``INPUT_ENTRIES`` entries, or one holding
    anything but files, directories and links. ``src`` itself is the user's choice and is opened as given;
    below it both walks (the measure, then the copy, held to the same bounds) follow no link."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputDirError(f"input directory {str(src)!r}: {exc.strerror}") from None
    held = f"/proc/self/fd/{fd}"  # the directory opened, not its path resolved again
    try:
        if _measure(held, str(src), limit) > limit:
            raise InputDirError(
                f"input directory {str(src)!r} holds more than {limit} bytes, which are copied into the jail; {_ADVICE}"
            )
        try:
            sb.put(held, dst, INPUT_ENTRIES, limit)  # a tree changed since it was measured is held to it too
        except SandboxFileError as exc:
            raise _refused(exc, held, str(src)) from None
    finally:
        os.close(fd)


_ADVICE = "give a directory with only the task's files, e.g. --input_dir ./task/input"


def _measure(held: str, shown: str, limit: int) -> int:
    """Bytes of regular files beneath the directory ``held`` (``hostfs.read_source``: no link followed,
    at most ``INPUT_ENTRIES`` entries, a FIFO, socket or device refused); stops counting once past ``limit``."""
    size = 0
    try:
        with closing(hostfs.read_source(held, INPUT_ENTRIES)) as walk:
            for entry in walk:
                size += entry.size if entry.kind == "file" else 0
                if size > limit:
                    break
    except SandboxFileError as exc:
        raise _refused(exc, held, shown) from None
    return size


def _refused(exc: SandboxFileError, held: str, shown: str) -> InputDirError:
    where = str(exc.filename or held).replace(held, shown, 1)
    return InputDirError(f"input directory {shown!r}: {where}: {exc.strerror}; {_ADVICE}")
