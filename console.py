"""The ``jailbox`` console script, in the user's process: ``jailbox exec [--] CMD...`` with no option
goes through the per-user service's fast path (``servers/exec_service/quick.py``, stdlib only); every other
command line, and any call that path declines, goes to the full CLI (``cli/``) with argv untouched.

Here rather than in ``sandbox/``, which never imports the CLI. Nothing at this module's top level may
import click or pydantic: ``tests/test_cli_imports.py`` holds the fast path to the standard library.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from .servers.exec_service import quick


def main() -> None:
    quick.main(sys.argv[1:], full_cli)


def full_cli() -> NoReturn:
    from .cli import main as cli_main

    cli_main()
    sys.exit(0)  # click exits by itself; this only satisfies the type
