"""The config file (``~/.config/jailbox/config.yaml`` or ``.toml``): its defaults for each command's
options, read once per process, and the reference of every key it takes.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click


def _settings_path() -> str:
    """~/.config/jailbox/config.yaml (or .yml, .toml: the first that exists), under $XDG_CONFIG_HOME if set.
    Plain ``os.path``: every command reads it, and pathlib is one more import for ``--help`` to pay."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    base = os.path.join(config_home, "jailbox")
    for name in ("config.yaml", "config.yml", "config.toml"):
        if os.path.exists(os.path.join(base, name)):
            return os.path.join(base, name)
    return os.path.join(base, "config.yaml")


def _settings() -> dict[str, Any]:
    """Defaults for any command's options from ``_settings_path()``, a section per command, e.g.
    ``run: {llm_base_url: http://localhost:8000/v1, llm_name: qwen3}``; flags still win."""
    path = _settings_path()
    if not os.path.exists(path):
        return {}
    if path.endswith(".toml"):
        if sys.version_info >= (3, 11):
            import tomllib

            data = tomllib.loads(_read_settings(path))
        else:  # tomllib came with 3.11, and jailbox adds no TOML dependency for 3.10
            raise click.UsageError(f"{path}: TOML settings need Python 3.11 or newer; use config.yaml")
    else:
        import yaml

        data = yaml.safe_load(_read_settings(path)) or {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise click.UsageError(f"{path}: expected a section per command, e.g. 'run: {{llm_name: qwen3}}'")
    return {cmd: _underscored(opts) for cmd, opts in data.items()}


def _read_settings(path: str) -> str:
    with open(path) as file:
        return file.read()


def _underscored(section: dict[str, Any]) -> dict[str, Any]:
    """Keys as click names parameters (``llm-name`` -> ``llm_name``), a group's sections too."""
    return {str(k).replace("-", "_"): _underscored(v) if isinstance(v, dict) else v for k, v in section.items()}


def _settings_keys(group: click.Group, ctx: click.Context) -> dict[str, Any]:
    """Per command (a group's commands nested), the keys its config-file section takes: its options' names."""
    keys: dict[str, Any] = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            keys[name] = _settings_keys(command, ctx)
        elif command is not None:
            keys[name] = {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}
    return keys


def _unknown_settings(data: dict[str, Any], keys: dict[str, Any], where: str = "") -> list[str]:
    """``section.key`` for every key of ``data`` that no command takes (a typo is not ignored silently)."""
    unknown = []
    for name, value in data.items():
        if name not in keys:
            unknown.append(f"{where}{name}")
        elif isinstance(value, dict) and all(not isinstance(v, click.Parameter) for v in keys[name].values()):
            unknown += _unknown_settings(value, keys[name], f"{where}{name}.")
        elif isinstance(value, dict):
            unknown += [f"{where}{name}.{key}" for key in value if key not in keys[name]]
    return unknown


def settings_reference(group: click.Group, ctx: click.Context, indent: str = "") -> list[str]:
    """The config file's every key, a section per command (a group's nested), with its default and the flag
    it sets: read off the commands themselves, so it cannot drift from them."""
    import json

    lines = []
    for name, keys in _settings_keys(group, ctx).items():
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            lines += [f"{indent}{name}:", *settings_reference(command, ctx, indent + "  ")]
            continue
        if not keys:
            continue
        lines.append(f"{indent}{name}:")
        for key, param in keys.items():
            default = param.default
            if isinstance(default, tuple | list):
                default = list(default)
            elif not isinstance(default, str | int | float | bool):  # click's "no default" marker, or a callable
                default = [] if param.multiple else False if param.is_flag else None
            value = json.dumps(default)
            flag = next(opt for opt in param.opts if opt.startswith("--"))  # its name; aliases come after it
            what = f"{flag}{' (repeatable: a list)' if param.multiple else ''}"
            help_text = " ".join((param.help or "").split())
            lines.append(f"{indent}  {key}: {value}  # {what}{': ' + help_text if help_text else ''}")
    return lines
