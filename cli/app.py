"""The ``jailbox`` group itself: the config file's defaults applied to every command, unknown keys warned.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import click

from .. import __version__
from .errors import _OneLineGroup
from .settings import _settings, _settings_keys, _settings_path, _unknown_settings


@click.group(cls=_OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, message="jailbox %(version)s")  # not the installed metadata: slow to read
@click.pass_context
def main(ctx: click.Context) -> None:
    """jailbox: rootless sandboxes for running untrusted code and LLM agents, without Docker.

    \b
    Example:
      jailbox exec -- python3 -c 'print(6*7)'
    """
    ctx.default_map = _settings()
    if ctx.resilient_parsing:  # shell completion: nothing on stderr
        return
    for key in _unknown_settings(ctx.default_map, _settings_keys(main, ctx)):
        click.echo(
            f"jailbox: warning: {_settings_path()}: unknown key {key!r}, ignored (`jailbox config --reference` "
            "lists every key)",
            err=True,
        )
