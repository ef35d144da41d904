"""The table a person reads and the JSON a later run is compared against."""

from __future__ import annotations

from bench.results import CaseResult, Row
from bench.timing import Summary

HEADER = ("case", "p50", "p99", "unit", "n", "baseline", "base p50", "base p99", "ratio", "target", "status")


def number(value: float | None) -> str:
    """Three or so significant digits, without switching to exponent notation."""
    if value is None:
        return "-"
    for limit, digits in ((100, 0), (10, 1), (1, 2)):
        if abs(value) >= limit:
            return f"{value:.{digits}f}"
    return f"{value:.3f}"


def _cells(row: Row) -> tuple[str, ...]:
    value: Summary = row.value
    base = row.baseline
    target = row.target
    return (
        row.name,
        number(value.median),
        number(value.p99),
        row.unit,
        str(value.n),
        row.baseline_name or "-",
        number(base.median) if base else "-",
        number(base.p99) if base else "-",
        number(row.ratio),
        target.text if target else "-",
        target.status if target else "-",
    )


def table(results: dict[str, CaseResult]) -> str:
    lines = [HEADER, *(_cells(row) for result in results.values() for row in result.rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    numeric = {1, 2, 4, 6, 7, 8}
    out = []
    for line in lines:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def notes(results: dict[str, CaseResult]) -> list[str]:
    """Skips, missing baselines, failures and errors: everything a figure does not say by itself."""
    found = []
    for key, result in results.items():
        found += [f"{key}: skipped {reason}" for reason in result.skipped]
        found += [f"{key}: {note}" for row in result.rows for note in row.notes]
        if result.error:
            found.append(f"{key}: ERROR {result.error}")
    return list(dict.fromkeys(found))


def machine_lines(machine: dict[str, object]) -> str:
    return "\n".join(f"{key:>7}: {value}" for key, value in machine.items())


def as_json(machine: dict[str, object], settings: dict[str, object], results: dict[str, CaseResult]) -> dict:
    return {
        "machine": machine,
        "settings": settings,
        "cases": {key: result.as_dict() for key, result in results.items()},
    }
