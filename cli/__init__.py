"""The ``jailbox`` command, in the user's process: click commands only (parse, call ``sandbox``/``agent``, print).

One module per group of commands (``execute``, ``sandboxes``, ``run``, ``bench``, ``rootfs``, ``snapshots``,
``servers``, ``host``, ``view``), each a set of thin declarations over library calls; the option groups they share are
``options`` (``run``'s own: ``run_options``), the config file ``settings``, and every way a command fails
``errors``.

Import-light: a user times every ``jailbox exec`` from a shell, so these modules load click and the stdlib
it shares, nothing else. Each command imports what it uses inside its body (the jail for ``exec``, the
agent for ``run``, the store for ``rootfs``), and pydantic loads with the first model a command builds.
``tests/test_cli_imports.py`` holds ``exec`` and ``--help`` to a budget of modules.
"""

from . import bench, execute, host, rootfs, run, sandboxes, servers, snapshots, view  # noqa: F401  (each registers its commands)
from .app import main
from .bench import bench_cmd
from .execute import exec_cmd
from .options import _config, default_rootfs
from .run import run_cmd

__all__ = ["_config", "bench_cmd", "default_rootfs", "exec_cmd", "main", "run_cmd"]
