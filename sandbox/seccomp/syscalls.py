"""This machine's syscalls by name and number, for seccomp policies (host side, before any fork).

The table is python-ptrace's for the native ABI plus the generic numbers of syscalls newer than
it; x86_64 and aarch64 are the architectures a filter is built for. Used by the policy model
(names a user wrote must exist), the BPF compiler (names to numbers) and results (numbers the
init reports back to names).
"""

from __future__ import annotations

import importlib.util
import os
import platform
from functools import lru_cache

from ..errors import ConfigError

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# Syscalls newer than python-ptrace's table (the generic numbers, shared by x86_64 and aarch64).
NEWER = {
    441: "epoll_pwait2", 442: "mount_setattr", 443: "quotactl_fd", 444: "landlock_create_ruleset",
    445: "landlock_add_rule", 446: "landlock_restrict_self", 447: "memfd_secret", 448: "process_mrelease",
    449: "futex_waitv", 450: "set_mempolicy_home_node", 451: "cachestat", 452: "fchmodat2",
    453: "map_shadow_stack", 454: "futex_wake", 455: "futex_wait", 456: "futex_requeue", 457: "statmount",
    458: "listmount", 459: "lsm_get_self_attr", 460: "lsm_set_self_attr", 461: "lsm_list_modules",
    462: "mseal", 463: "setxattrat", 464: "getxattrat", 465: "listxattrat", 466: "removexattrat",
    467: "open_tree_attr",
}  # fmt: skip


def arch() -> str:
    machine = platform.machine()
    if machine not in AUDIT_ARCH:
        raise ConfigError(f"seccomp filters are built for x86_64 and aarch64, not {machine}; use seccomp=None")
    return machine


@lru_cache(maxsize=4)
def syscall_table(machine: str) -> dict[str, int]:
    """name -> number for the native ABI (python-ptrace's table plus the newer generic numbers)."""
    table = {name: nr for nr, name in _ptrace_names(machine).items() if nr < 512}
    table.update({name: nr for nr, name in NEWER.items()})
    return table


def _ptrace_names(machine: str) -> dict[int, str]:
    """python-ptrace's number -> name table for ``machine``: its one data module, loaded by path. Imported
    as ``ptrace.syscall.linux.x86_64`` it would first run the packages' ``__init__``, which load ctypes and
    the whole debugger (some 30 modules that every ``jailbox exec`` would pay for one dict)."""
    package = importlib.util.find_spec("ptrace")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ConfigError("python-ptrace (a jailbox dependency) is not installed: pip install python-ptrace")
    path = os.path.join(next(iter(package.submodule_search_locations)), "syscall", "linux", f"{machine}.py")
    spec = importlib.util.spec_from_file_location(f"jailbox_ptrace_syscalls_{machine}", path)
    if spec is None or spec.loader is None or not os.path.isfile(path):
        raise ConfigError(f"python-ptrace has no syscall table at {path}: pip install --force-reinstall python-ptrace")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names: dict[int, str] = module.SYSCALL_NAMES
    return names


@lru_cache(maxsize=4)
def syscall_names(machine: str) -> dict[int, str]:
    return {nr: name for name, nr in syscall_table(machine).items()}


def syscall_numbers(names: list[str], machine: str, strict: bool) -> list[int]:
    """Numbers for ``names``; unknown names are an error when the user wrote them (``strict``)."""
    table = syscall_table(machine)
    unknown = [n for n in names if n not in table]
    if unknown and strict:
        raise ConfigError(f"unknown syscall name(s) for {machine}: {', '.join(sorted(unknown))}")
    return sorted({table[n] for n in names if n in table})


def name_of(key: str, machine: str) -> str:
    """A refused-syscall key from the init (``"165"``, ``"x32:165"``, ``"arch:3"``) as a name."""
    if key.isdigit():
        return syscall_names(machine).get(int(key), f"syscall_{key}")
    return key
