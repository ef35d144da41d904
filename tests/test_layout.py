"""The package's layering, read from the source (nothing is imported):

- the import graph of the top-level modules (``__init__.py``, ``console.py``, ...), ``sandbox/``,
  ``agent/``, ``servers/`` and ``cli/`` has no cycle, counting imports inside functions and ``TYPE_CHECKING``
  blocks (a circle hidden in a function is still one);
- the child side (``sandbox/child``, ``sandbox/floor``), which runs under ``python -I -S`` in the
  launcher and as the jail's init, imports only the standard library and the floor (child also
  itself);
- ``sandbox/`` never imports ``agent``, ``servers``, ``cli`` or ``rl``; ``agent/`` and ``rl/`` reach the
  jail only through the public names of ``jailbox.sandbox`` and ``jailbox.sandbox.errors``; ``servers/`` through
  those, ``jailbox.sandbox.serving`` (the internal surface made for them) and the stdlib-only frame
  format ``jailbox.sandbox.floor.wire``.
"""

from __future__ import annotations

import ast
import builtins
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.once  # the import graph is the same whoever runs it

ROOT = Path(__file__).resolve().parent.parent
TOP = "jailbox"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported, or the package a name was taken from
    names: tuple[str, ...]  # names taken (``from X import a, b``), () for ``import X``
    absolute: bool  # written as an absolute import
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([TOP, *parts])


def _sources() -> dict[str, Path]:
    files = sorted(ROOT.glob("*.py"))  # the package's own modules: __init__, console, extras
    for package in ("sandbox", "agent", "servers", "cli", "rl"):
        files += sorted((ROOT / package).rglob("*.py"))
    return {_module_name(f): f for f in files}


MODULES = _sources()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    package = module if _is_package(module) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):  # every import, at any depth: functions and TYPE_CHECKING blocks too
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, (), True, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = tuple(alias.name for alias in node.names)
            found.append(Import(module, target, names, node.level == 0, node.lineno))
    return found


def _edges(imp: Import) -> set[str]:
    """Modules of this package that ``imp`` runs: a submodule taken by name, else the module itself."""
    edges = set()
    for name in imp.names:
        if f"{imp.target}.{name}" in MODULES:
            edges.add(f"{imp.target}.{name}")
        elif imp.target in MODULES:
            edges.add(imp.target)
    if not imp.names and imp.target in MODULES:
        edges.add(imp.target)
    return edges


GRAPH = {module: {e for imp in _imports(module) for e in _edges(imp)} - {module} for module in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    for start in sorted(graph):
        if color[start] != white:
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        color[start] = grey
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = black
                stack.pop()
            elif color[nxt] == grey:
                return [*path[path.index(nxt) :], nxt]
            elif color[nxt] == white:
                color[nxt] = grey
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_graph_is_read():
    assert "jailbox.sandbox.seccomp.policy" in GRAPH["jailbox.sandbox.config"]
    assert "jailbox.sandbox.floor.wire" in GRAPH["jailbox.sandbox.child.init"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_child_side_imports_only_the_standard_library_and_the_floor():
    floor, child = f"{TOP}.sandbox.floor", f"{TOP}.sandbox.child"
    bad = []
    for module in MODULES:
        if not (_inside(module, floor) or _inside(module, child)):
            continue
        allowed = (floor,) if _inside(module, floor) else (floor, child)
        for imp in _imports(module):
            top = imp.target.split(".")[0]
            if imp.absolute and top != TOP:
                ok = top in sys.stdlib_module_names
            else:
                ok = all(any(_inside(e, p) for p in allowed) for e in _edges(imp)) and any(
                    _inside(imp.target, p) for p in allowed
                )
            if not ok:
                bad.append(f"{module}:{imp.line} imports {imp.target} {list(imp.names)}")
    assert not bad, "\n".join(bad)


def test_the_jail_never_imports_the_agent_the_servers_or_the_cli():
    above = (f"{TOP}.agent", f"{TOP}.servers", f"{TOP}.cli", f"{TOP}.rl")
    bad = [
        f"{imp.source}:{imp.line} imports {imp.target} {list(imp.names)}"
        for module in MODULES
        if _inside(module, f"{TOP}.sandbox")
        for imp in _imports(module)
        if any(_inside(e, p) for e in _edges(imp) for p in above) or any(_inside(imp.target, p) for p in above)
    ]
    assert not bad, "\n".join(bad)


def _public_sandbox_names() -> set[str]:
    """``jailbox.sandbox.__all__``, read from its source."""
    tree = ast.parse(MODULES[f"{TOP}.sandbox"].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("jailbox.sandbox has no __all__")


@pytest.mark.parametrize(
    ("package", "also"),
    [
        ("agent", ()),
        ("rl", ()),
        ("servers", ("sandbox.serving", "sandbox.floor.wire")),
    ],
)
def test_the_agent_and_the_servers_use_only_the_jails_faces(package: str, also: tuple[str, ...]) -> None:
    public = _public_sandbox_names()
    sandbox = f"{TOP}.sandbox"
    allowed = {f"{TOP}.sandbox.errors", *(f"{TOP}.{a}" for a in also)}
    bad = []
    for module in MODULES:
        if not _inside(module, f"{TOP}.{package}"):
            continue
        for imp in _imports(module):
            if imp.target in allowed or (imp.names and _edges(imp) and _edges(imp) <= allowed):
                continue
            if imp.target == sandbox:
                if set(imp.names) <= public:
                    continue
            elif not _inside(imp.target, sandbox) and not any(_inside(e, sandbox) for e in _edges(imp)):
                continue
            bad.append(f"{module}:{imp.line} imports {imp.target} {list(imp.names)}")
    assert not bad, "\n".join(bad)


# Exceptions of code that may not import the family: the jail's init and the launcher's child side
# (stdlib and the floor only), the unpack worker's engine, and the command line's fast path to the
# per-user service (stdlib and the wire format only); each is turned into an error of the family, or
# a one-line message, where it is met.
OWN_EXCEPTIONS = {"sandbox/child/", "sandbox/floor/", "sandbox/rootfs/untar.py", "servers/exec_service/quick.py"}
BUILTIN_ERRORS = {  # warnings and interrupts (KeyboardInterrupt, SystemExit) are not errors
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception) and not issubclass(value, Warning)
}


def test_every_exception_is_of_the_one_family() -> None:
    """A class deriving from built-in exceptions only would be a second root: every error jailbox
    defines descends from ``errors.JailboxError`` (through the jail's, the agent's or the servers'
    root), but the jail-side processes' own and private control flow."""
    roots = []
    for path in _sources().values():  # the package's own files, not a build's copy of them
        rel = path.relative_to(ROOT).as_posix()
        if any(rel.startswith(p) for p in OWN_EXCEPTIONS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_") or not node.bases:
                continue
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            if len(bases) == len(node.bases) and all(b in BUILTIN_ERRORS for b in bases):
                roots.append(f"{rel}: {node.name}({', '.join(bases)})")
    assert roots == ["sandbox/errors.py: JailboxError(Exception)"], roots
