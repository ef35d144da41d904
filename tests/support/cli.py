"""The one command line the tests start the ``jailbox`` CLI with (a child of the test process).

``JAILBOX`` runs the CLI in the test's own interpreter (``sys.executable``), so it is this checkout's code
and this venv's packages whatever ``PATH`` holds, and it does what the ``jailbox`` console script does:
import ``jailbox.cli`` and call ``main``. ``-c`` rather than ``-m jailbox.cli``: no ``runpy`` and no
``__main__`` module of the package's own, so the modules loaded are the console script's, and click names
the program after ``argv[0]`` (``-c``) instead of ``python -m jailbox.cli``; no test reads that name (the
one-line errors say ``jailbox:`` themselves). Both forms put the working directory first on ``sys.path``.
Tests add a command and its arguments, and a prefix where they need one (``nice -n 19``).
"""

from __future__ import annotations

import sys

JAILBOX = [sys.executable, "-c", "from jailbox.cli import main; main()"]
