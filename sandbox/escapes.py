"""Text that others chose, made safe for the user's terminal: the one place jailbox escapes what it prints.

A jail's output, a model's reply, a trajectory or tasks file, an image's names and a server's answers
are hostile. Printed raw, their control characters are the terminal's commands: OSC 52 sets the
clipboard (to ``curl ... | sh``, say), OSC 0 the window title, ``ESC[2J ESC[H`` clears the screen to
hide what came before, a backspace or a lone carriage return overwrites what is shown, and the bidi
overrides (U+202E...) show text in another order than it is. ``printable`` shows each such character
as its Python escape, in plain characters (``ESC`` as the four characters ``\\x1b``, U+202E as
``\\u202e``), so it is seen, never obeyed. A backslash is left as it is: text that already reads
``\\x1b`` looks the same as an escaped ESC, which misleads no terminal (and escaping is idempotent).

Only what goes to a terminal is escaped: records (``trajectory.json``, results, JSON output, whose
encoder escapes controls itself) keep the exact text. Standard library only: the CLI's fast path and
``--help`` import it.
"""

from __future__ import annotations

import re

# C0 controls but newline and tab, DEL, C1 controls (an 8-bit terminal reads U+009B as CSI), the bidi
# controls, and lone surrogates (what surrogateescape makes of bytes that are not UTF-8, which no UTF-8
# stream can encode). A carriage return followed by a newline is a line end (CRLF), not an overwrite.
_UNSAFE = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_IN_TEXT = re.compile(f"[{_UNSAFE}]|\r(?!\n)")
_IN_LINE = re.compile(f"[{_UNSAFE}\t\n\r]")  # a table cell, a task id, a label: one line, its layout jailbox's


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, line: bool = False) -> str:
    """``text`` with every character a terminal would obey shown escaped; newlines and tabs are kept as
    layout, unless ``line`` (the text is one field of a line jailbox lays out), which escapes them too."""
    return (_IN_LINE if line else _IN_TEXT).sub(_escape, text)
