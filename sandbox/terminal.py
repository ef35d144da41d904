"""The user's terminal wired to a command on a pty inside the jail (``jailbox shell``).

Runs in the host process, between its own stdin/stdout and the ``TtyCommand``'s pty master; nothing
here runs in the jail, and nothing the jail sends is interpreted: its bytes go to the terminal as
they come. What it bounds: one read (``CHUNK`` bytes) is all it holds at a time, so a command that
floods its terminal costs the host one buffer; the host terminal's mode and SIGWINCH handler are
restored, and the command closed, whatever happens.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import termios
import tty

from .execution import TtyCommand

CHUNK = 65536


def attach(command: TtyCommand, in_fd: int, out_fd: int) -> int:
    """Pump ``in_fd`` to the command and its output to ``out_fd`` until it exits; its exit code.

    When ``in_fd`` is a terminal it is put in raw mode (typeahead kept) and the pty follows its size.
    The command is closed on return: this takes it over.
    """
    interactive = os.isatty(in_fd)

    def resize(*_: object) -> None:
        if interactive:
            size = fcntl.ioctl(in_fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(command.master, termios.TIOCSWINSZ, size)

    resize()
    saved = termios.tcgetattr(in_fd) if interactive else None
    previous = signal.signal(signal.SIGWINCH, resize)
    try:
        if interactive:
            tty.setraw(in_fd, termios.TCSADRAIN)  # keep typeahead
        return _pump(in_fd, out_fd, command)
    finally:
        if saved is not None:
            termios.tcsetattr(in_fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
        command.close()


def _pump(in_fd: int, out_fd: int, command: TtyCommand) -> int:
    master = command.master
    watch = [in_fd, master, command.fileno()]
    while True:
        try:
            ready, _, _ = select.select(watch, [], [])
        except InterruptedError:
            continue
        if master in ready and not _copy(master, out_fd):
            watch.remove(master)
        if in_fd in ready and not _copy(in_fd, master):
            watch.remove(in_fd)
        if command.fileno() in ready:
            os.set_blocking(master, False)
            while _copy(master, out_fd):
                pass
            return command.exit_code()


def _copy(src: int, dst: int) -> bool:
    """One read from ``src`` written to ``dst``; False at end of file or when ``src`` fails (the pty closed)."""
    try:
        data = os.read(src, CHUNK)
    except OSError:
        return False
    if data:
        os.write(dst, data)
    return bool(data)
