"""The command line of jailbox's own ``python -I -S`` processes (the launcher, the unpack worker).

``-I -S`` keeps the user's environment and site-packages out of processes that hold privileges in a
user namespace, so the top-level package is loaded from its directory by hand: that works the same
installed (``site-packages/jailbox``), installed in editable mode, and from a checkout of any name.
Runs in the host process; the boot text runs in the new interpreter. Stdlib only.
"""

from __future__ import annotations

import sys
from pathlib import Path

_TOP = __package__.split(".")[0]  # "jailbox"
_TOP_DIR = str(Path(__file__).resolve().parents[len(__package__.split(".")) - 1])
_BOOT = (
    "import importlib, importlib.util, sys; "
    "top, where, module = sys.argv[1:4]; "
    "spec = importlib.util.spec_from_file_location(top, where + '/__init__.py', submodule_search_locations=[where]); "
    "package = importlib.util.module_from_spec(spec); sys.modules[top] = package; spec.loader.exec_module(package); "
    "importlib.import_module(module).main(sys.argv[4:])"
)


def command(module: str, *args: str) -> list[str]:
    """argv that runs ``main(list(args))`` of ``module`` (relative to this package's top, e.g.
    ``sandbox.child.zygote``) in a fresh isolated interpreter; the module path shows in ``ps``."""
    return [sys.executable, "-I", "-S", "-c", _BOOT, _TOP, _TOP_DIR, f"{_TOP}.{module}", *args]
