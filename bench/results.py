"""What a case reports: rows of candidate against baseline, with the target each row is held to."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from bench.timing import Summary


def ratio(value: Summary, baseline: Summary | None) -> float | None:
    """Candidate median over baseline median (above 1 is slower for times, faster for rates)."""
    if baseline is None or baseline.median == 0:
        return None
    return value.median / baseline.median


@dataclass(frozen=True)
class Target:
    text: str
    met: bool | None
    status: str

    @classmethod
    def check(cls, text: str, met: bool | None, unknown: str = "") -> Target:
        """``met`` None means the target cannot be judged; ``unknown`` says why."""
        status = "met" if met else "NOT met" if met is False else f"n/a ({unknown})"
        return cls(text, met, status)


@dataclass(frozen=True)
class Row:
    name: str
    unit: str
    value: Summary
    baseline_name: str = ""
    baseline: Summary | None = None
    target: Target | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return ratio(self.value, self.baseline)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "unit": self.unit,
            **asdict(self.value),
            "baseline": {"name": self.baseline_name, **asdict(self.baseline)} if self.baseline else None,
            "baseline_name": self.baseline_name or None,
            "ratio": self.ratio,
            "target": asdict(self.target) if self.target else None,
            "notes": self.notes,
            "extra": self.extra,
        }


@dataclass
class CaseResult:
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"rows": [row.as_dict() for row in self.rows], "skipped": self.skipped, "error": self.error}
