"""Scorers for the answer an agent leaves in ``answer.txt``, one per kind of benchmark answer.

The paper's domains ask for different answer formats (``\\boxed{}`` for math and physics, one
choice letter for chemistry and biomedicine, plain text for long context and instruction following),
and models do not always follow them to the letter, so each scorer extracts the answer leniently
before comparing it strictly. Every scorer maps ``(answer, expected)`` to a float in [0, 1]. Where the
reference benchmark has a scorer for a domain, the one here gives its verdicts: ``choice`` reads a letter by
its rules, ``instructions`` checks IFBench instructions by its loose rule (``ifeval``), and ``judge`` asks a
model as its LLM-as-a-judge step does (``judge``).

Runs where a batch scores (the driver) or where an RL environment steps. A tasks file names its scorer,
and a tasks file is data: it picks from ``load_scorers``' names (the built-ins, installed entry points and
the modules the user named), never a module or function to import.
"""

from __future__ import annotations

import cmath
import importlib
import importlib.metadata
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..extras import missing
from ..sandbox.errors import AgentError
from . import ifeval, judge

Scorer = Callable[..., float]
"""``(answer, expected) -> float``; one that also takes ``question=`` is given the task's question."""

# Symbolic comparison is skipped for longer expressions: there is no timeout, so size is the guard.
_MAX_SYMPY_CHARS = 200
_REL_TOL = 1e-6


def _normalize_text(text: str) -> str:
    """Case, spacing and a final full stop are not part of a short answer."""
    text = " ".join(text.split()).lower()
    return text[:-1].rstrip() if text.endswith(".") else text


def exact_match(answer: str, expected: str) -> float:
    """1.0 when the answers are the same text after normalisation."""
    return float(_normalize_text(answer) == _normalize_text(expected))


# ---------------------------------------------------------------------------------------------------
# \boxed{} extraction

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _braced(text: str) -> tuple[str, int] | None:
    """The content of the brace group that opens ``text`` and the index after it; None if unbalanced."""
    depth = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[1:i], i + 1
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}``, braces balanced; None if there is none.

    Also takes the brace-less ``\\boxed 5`` form. An unbalanced last box falls back to the one before.
    """
    for match in reversed(list(_BOX.finditer(text))):
        rest = text[match.end() :]
        if rest.lstrip().startswith("{"):
            group = _braced(rest.lstrip())
            if group is not None:
                return group[0].strip()
        elif bare := re.match(r"\s+([^\s$]+)", rest):
            return bare.group(1)
    return None


_TEXT_MACRO = re.compile(r"\\(?:text|textrm|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


def _unwrap_text(text: str) -> str:
    """``\\text{B}`` is just B: models wrap words and letters in text macros inside boxes."""
    return _TEXT_MACRO.sub(r"\1", text)


# ---------------------------------------------------------------------------------------------------
# Multiple choice, read as the reference's chemistry and biomedicine scorers read it

_ANSWER_FIELD = re.compile(r'"answer"\s*:\s*"([A-Z])"', re.IGNORECASE)
_ANSWER_COLON = re.compile(r"answer\s*[:\uff1a]\s*([A-Z])\b", re.IGNORECASE)
_ANSWER_IS = re.compile(r"(?:answer|choice)\s+is\s+([A-Z])\b", re.IGNORECASE)
_STANDALONE = re.compile(r"\b([A-Z])\b")


def _plain_boxed(text: str) -> str | None:
    """What the reference takes from the last ``\\boxed{``: braces counted, no escapes, no ``\\fbox``."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    start += len("\\boxed{")
    depth = 1
    for i in range(start, len(text)):
        depth += (text[i] == "{") - (text[i] == "}")
        if depth == 0:
            return text[start:i].strip()
    return None


def choice_letter(text: str) -> str | None:
    """The chosen option letter, upper-cased, or None; the first of these rules that finds one decides:
    an ``"answer": "C"`` field, ``Answer: C``, ``the answer is C`` (or ``choice is``), the first letter of
    the last box, the last letter standing alone anywhere, the text's first character if it is a letter.

    These are the reference's rules, in its order, so a benchmark scores as the paper's did: they are lenient
    (``the answer is a dog`` reads A), and a model that writes only the letter, as the prompts ask, is read
    right by all of them.
    """
    for pattern in (_ANSWER_FIELD, _ANSWER_COLON, _ANSWER_IS):
        if found := pattern.search(text):
            return found.group(1).upper()
    boxed = _plain_boxed(text)
    if boxed and boxed != text.strip() and boxed[0].upper().isalpha():
        return boxed[0].upper()
    if letters := _STANDALONE.findall(text.upper()):
        return str(letters[-1])
    first = text.strip()[:1]
    return first.upper() if first.upper().isalpha() else None


def choice_match(answer: str, expected: str) -> float:
    """1.0 when the answer is the expected text (case aside) or its chosen letter is."""
    wanted = expected.strip().upper()
    return float(answer.strip().upper() == wanted or (choice_letter(answer) or "") == wanted)


# ---------------------------------------------------------------------------------------------------
# Multiple answers

_ANSWER_PREFIX = re.compile(r"^(?:the\s+)?(?:final\s+)?answers?\s*(?:is|are)?\s*[:=]?\s*", re.IGNORECASE)
_ITEM_SEPARATOR = re.compile(r"\s*(?:[,;\n]|&|\band\b)\s*", re.IGNORECASE)
_LETTER_RUN = re.compile(r"[A-Z]{2,}")
_SHORT_ITEM = re.compile(r"[A-Za-z]|[-+]?\d+(?:\.\d+)?")
_ITEM_EDGES = " \t*.()[]{}\"'\\"


def _split_short_items(body: str) -> list[str]:
    """``A C`` and ``2 3 5`` are lists, but ``airline industry`` is one item: split on spaces only between
    letters and numbers."""
    words = body.split()
    return words if all(_SHORT_ITEM.fullmatch(word) for word in words) else [body]


def choice_set(text: str) -> set[str]:
    """The set of items an answer names, lower-cased: ``A, C``, ``{B,D}``, ``\\boxed{A,C}``, ``AC``, lines."""
    body = _unwrap_text(last_boxed(text) or text)
    body = _ANSWER_PREFIX.sub("", body.strip()).strip(_ITEM_EDGES)
    parts = _ITEM_SEPARATOR.split(body) if _ITEM_SEPARATOR.search(body) else _split_short_items(body)
    parts = [part.strip(_ITEM_EDGES) for part in parts]
    if len(parts) == 1 and _LETTER_RUN.fullmatch(parts[0]):
        return set(parts[0].lower())
    return {_normalize_text(part) for part in parts} - {""}


def f1_score(answer: str, expected: str) -> float:
    """F1 between the predicted and expected sets, so a partly right multi-answer earns partial credit."""
    predicted, wanted = choice_set(answer), choice_set(expected)
    if not predicted and not wanted:
        return 1.0
    return 2 * len(predicted & wanted) / (len(predicted) + len(wanted))


# ---------------------------------------------------------------------------------------------------
# ROUGE-L


def _rouge_tokens(text: str) -> list[str]:
    return re.sub(r"[^\w\s]", "", text.lower()).split()


def _lcs_length(a: list[str], b: list[str]) -> int:
    """Longest common subsequence by dynamic programming, one row at a time."""
    previous = [0] * (len(b) + 1)
    for token in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if token == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(answer: str, expected: str) -> float:
    """ROUGE-L F-measure on lower-cased words without punctuation, for open answers."""
    predicted, reference = _rouge_tokens(answer), _rouge_tokens(expected)
    if not predicted or not reference:
        return float(predicted == reference)
    common = _lcs_length(predicted, reference)
    return 2 * common / (len(predicted) + len(reference))


# ---------------------------------------------------------------------------------------------------
# Math: normalisation

_LATEX_NOISE = re.compile(
    r"\\(?:left|right|displaystyle|degree)(?![A-Za-z])|\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\?%|\\?\$|\\[!,;:]"
)
_TRAILING_UNIT = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{[^{}]*\}(?:\^\s*\{?\d\}?)?\s*$")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_EQUATION_LHS = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?=(?!=)")


def _strip_units(text: str) -> str:
    """Drop trailing ``\\text{cm}``-style units after a value, but keep a ``\\text{}`` that is the whole answer."""
    while (unit := _TRAILING_UNIT.search(text)) and text[: unit.start()].strip():
        text = text[: unit.start()]
    return _unwrap_text(text)


def _normalize_math(text: str) -> str:
    """A canonical spelling of a LaTeX answer, so equal answers written differently compare equal as strings."""
    text = text.strip().replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    text = _LATEX_NOISE.sub("", text).replace("\\ ", " ").replace("~", " ")
    text = _strip_units(text).replace("\\{", "{").replace("\\}", "}")
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", text)
    text = re.sub(r"(?<![A-Za-z]) | (?![A-Za-z])", "", " ".join(text.split()))
    text = _EQUATION_LHS.sub("", text, count=1) if _EQUATION_LHS.match(text) else text
    text = text.removesuffix(".")
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return re.sub(r"(\d)\.0+(?![\d.])", r"\1", text)


def _encloses(text: str) -> bool:
    """Whether the bracket that opens ``text`` is the one that closes it: ``(1,2]`` yes, ``(1)+(2)`` no."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if depth == 0:
            return i == len(text) - 1
    return False


def _split_top_level(text: str) -> list[str]:
    """Split on the commas that no bracket encloses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _elements(text: str) -> tuple[str, list[str]]:
    """The brackets around a tuple or interval and its elements: ``(1,2]`` gives ``("(]", ["1", "2"])``."""
    if len(text) >= 2 and text[0] in "([{" and text[-1] in ")]}" and _encloses(text):
        return text[0] + text[-1], _split_top_level(text[1:-1])
    return "", _split_top_level(text)


# ---------------------------------------------------------------------------------------------------
# Math: LaTeX to sympy

_FUNCTIONS = {"sqrt", "pi", "oo", "log", "exp", "sin", "cos", "tan"}
_GREEK = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "theta",
    "lamda",
    "mu",
    "nu",
    "rho",
    "sigma",
    "tau",
    "phi",
    "omega",
)
_NAMES = _FUNCTIONS | set(_GREEK)
# LaTeX commands and their sympy spelling; sympy spells lambda ``lamda``, as ``lambda`` is a Python keyword.
_LATEX_WORDS = {
    "pi": " pi ",
    "infty": " oo ",
    "cdot": "*",
    "times": "*",
    "div": "/",
    "ln": " log ",
    **{name: f" {name} " for name in ("log", "exp", "sin", "cos", "tan", *_GREEK)},
    "lambda": " lamda ",
}
_LATEX_WORD = re.compile(r"\\(?:var)?([A-Za-z]+)")


def _brace_arguments(text: str, start: int, count: int) -> tuple[list[str], int] | None:
    """``count`` arguments after a command: brace groups or single characters; None if they are missing."""
    arguments = []
    for _ in range(count):
        while start < len(text) and text[start].isspace():
            start += 1
        if start >= len(text):
            return None
        if text[start] != "{":
            arguments.append(text[start])
            start += 1
            continue
        group = _braced(text[start:])
        if group is None:
            return None
        arguments.append(group[0])
        start += group[1]
    return arguments, start


def _expand_fractions_and_roots(text: str) -> str | None:
    """Rewrite ``\\frac{a}{b}``, ``\\sqrt{x}`` and ``\\sqrt[n]{x}`` as Python, innermost last."""
    while command := re.search(r"\\(frac|sqrt)(?![A-Za-z])\s*(?:\[([^\[\]]*)\])?", text):
        is_fraction = command.group(1) == "frac"
        parsed = _brace_arguments(text, command.end(), 2 if is_fraction else 1)
        if parsed is None:
            return None
        args, end = parsed
        if is_fraction:
            rendered = f"(({args[0]})/({args[1]}))"
        elif command.group(2):
            rendered = f"(({args[0]})**(1/({command.group(2)})))"
        else:
            rendered = f"sqrt({args[0]})"
        text = text[: command.start()] + rendered + text[end:]
    return text


def _latex_to_python(latex: str) -> str | None:
    """Common LaTeX as sympy-parsable text, or None when something is left that this does not know."""
    text = _expand_fractions_and_roots(latex)
    if text is None:
        return None
    text = _LATEX_WORD.sub(lambda command: _LATEX_WORDS.get(command.group(1), command.group(0)), text)
    text = text.replace("{", "(").replace("}", ")").replace("^", "**")
    text = re.sub(r"[A-Za-z]{2,}", _split_product, text)
    return None if "\\" in text else text


def _split_product(name: re.Match[str]) -> str:
    """``mg`` is m times g, as in LaTeX; known names stay whole."""
    word = name.group()
    return word if word in _NAMES else " ".join(word)


def _is_safe(text: str) -> bool:
    """The answer is untrusted and sympy evaluates it: allow arithmetic on short names only, no huge powers."""
    if len(text) > _MAX_SYMPY_CHARS or not re.fullmatch(r"[\w+\-*/().\s]*", text):
        return False
    if "__" in text or re.search(r"\.\s*[A-Za-z_]", text):
        return False
    if re.search(r"\*\*[\d.\s()+-]*\*\*", text) or re.search(r"\*\*\s*\(*\s*\d{4,}", text):
        return False
    names = re.findall(r"[A-Za-z_]\w*", text)
    return all(name in _NAMES or re.fullmatch(r"[A-Za-z](?:_?\d+)?", name) for name in names)


def symbolic() -> Any:
    """The sympy module, which the 'math' extra installs; imported at first need, as it takes about a second.
    Without it the scorer would call equal answers different, so its absence is a ``ScoringError`` naming
    the extra, never a verdict."""
    try:
        import sympy
    except ImportError as exc:
        raise ScoringError(missing("scorer 'math'", exc)) from None
    return sympy


def _to_sympy(latex: str) -> Any:
    """A sympy expression for a normalised LaTeX answer, or None."""
    sympy = symbolic()
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    text = _latex_to_python(latex)
    if text is None or not _is_safe(text):
        return None
    names: dict[str, Any] = {name: sympy.Symbol(name) for name in re.findall(r"\b[A-Za-z]\b", text)}
    names |= {"e": sympy.E, "pi": sympy.pi, "oo": sympy.oo}
    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    try:
        return parse_expr(text, local_dict=names, transformations=transformations)
    except Exception:  # untrusted text makes the parser raise almost anything
        return None


def _sympy_equivalent(a: str, b: str) -> bool:
    """Equal as numbers (within tolerance) or as expressions (their difference simplifies to zero)."""
    sympy = symbolic()
    left, right = _to_sympy(a), _to_sympy(b)
    if not isinstance(left, sympy.Expr) or not isinstance(right, sympy.Expr):
        return False
    try:
        if left == right:
            return True
        if left.is_number and right.is_number:
            return cmath.isclose(complex(left.evalf()), complex(right.evalf()), rel_tol=_REL_TOL, abs_tol=1e-12)
        return bool(sympy.simplify(left - right) == 0)
    except Exception:  # evaluating untrusted expressions can overflow, divide by zero, ...
        return False


# ---------------------------------------------------------------------------------------------------
# Math: comparison


def _to_float(text: str) -> float | None:
    """A plain number or a ``p/q`` fraction of plain numbers as a float, else None."""
    numerator, _, denominator = text.partition("/")
    try:
        value = float(numerator)
        return value / float(denominator) if denominator else value
    except (ValueError, ZeroDivisionError):
        return None


def _scalar_equivalent(a: str, b: str) -> bool:
    if a == b:
        return True
    left, right = _to_float(a), _to_float(b)
    if left is not None and right is not None:
        return math.isclose(left, right, rel_tol=_REL_TOL, abs_tol=1e-12)
    return _sympy_equivalent(a, b)


def _math_equivalent(a: str, b: str) -> bool:
    """Tuples, intervals and lists of sub-answers match element by element, with the same brackets."""
    if a == b:
        return True
    brackets_a, elements_a = _elements(a)
    brackets_b, elements_b = _elements(b)
    if len(elements_a) > 1 or len(elements_b) > 1:
        return (
            brackets_a == brackets_b
            and len(elements_a) == len(elements_b)
            and all(_scalar_equivalent(x, y) for x, y in zip(elements_a, elements_b, strict=True))
        )
    return _scalar_equivalent(a, b)


def _math_verify(answer: str, expected: str) -> bool:
    """The optional ``math-verify`` package's verdict when it is installed, else False."""
    try:
        verifier = importlib.import_module("math_verify")
    except ImportError:
        return False
    try:
        return bool(verifier.verify(verifier.parse(expected), verifier.parse(answer)))
    except Exception:  # a broken or strict third-party verifier must not fail the scoring
        return False


def _math_answer(text: str) -> str:
    boxed = last_boxed(text)
    return _normalize_math(text if boxed is None else boxed)


def math_equal(answer: str, expected: str) -> float:
    """1.0 when the answers are the same mathematical object: as text, as numbers, or symbolically.

    ``math-verify`` decides first when installed; what it rejects still gets the built-in comparison.
    """
    if _math_verify(answer, expected):
        return 1.0
    return float(_math_equivalent(_math_answer(answer), _math_answer(expected)))


# ---------------------------------------------------------------------------------------------------
# Registry

SCORERS: dict[str, Scorer] = {
    "exact": exact_match,
    "choice": choice_match,
    "multi_choice": f1_score,
    "f1": f1_score,
    "math": math_equal,
    "rouge_l": rouge_l,
    "instructions": ifeval.instructions,
    "judge": judge.unconfigured,
}

DOMAIN_SCORERS = {
    "math": "math",
    "physics": "judge",
    "chem": "choice",
    "biomed": "choice",
    "long_context": "judge",
    "instruct_follow": "instructions",
}
"""The scorer a task without one gets, by the start of its ``domain``: the reference benchmark's for that domain."""


def default_scorer(domain: str) -> str:
    """``domain``'s scorer in the reference benchmark (``DOMAIN_SCORERS``), else ``exact``."""
    lowered = domain.lower()
    return next((name for prefix, name in DOMAIN_SCORERS.items() if lowered.startswith(prefix)), "exact")


class ScoringError(AgentError, ValueError):
    """A scorer could not give a score (an instruction it has no check for, an unreachable judge)."""


ENTRY_POINTS = "jailbox.scorers"
"""The entry point group installed packages put their scorers in (``name = package.module:function``)."""


def load_scorers(modules: Iterable[str] = (), judge_config: judge.JudgeConfig | None = None) -> dict[str, Scorer]:
    """Every scorer a run may name: the built-ins (``judge`` asking ``judge_config``'s model when given), the
    installed ``jailbox.scorers`` entry points, and the public functions of each module named here (by the
    user, never by a tasks file), by name.

    A name that two of them give to different functions is an error, so a task never gets a scorer other
    than the one its name says.
    """
    found: dict[str, tuple[Scorer, str]] = {name: (function, "built-in") for name, function in SCORERS.items()}
    if judge_config is not None:
        found["judge"] = (judge.Judge(judge_config), "built-in")

    def add(name: str, function: Any, origin: str) -> None:
        if not callable(function):
            raise ValueError(f"scorer {name!r} from {origin} is not callable")
        if name in found and found[name][0] is not function:
            raise ValueError(f"scorer {name!r} from {origin} clashes with the one from {found[name][1]}")
        found[name] = (function, origin)

    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            loaded = entry.load()
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load scorer {entry.name!r} ({entry.value}): {exc}") from exc
        add(entry.name, loaded, f"entry point {entry.value}")
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import scorer module {module_name!r}: {exc}") from exc
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("_") and function.__module__ == module.__name__:
                add(name, function, f"module {module_name}")
    return {name: function for name, (function, _) in found.items()}


def resolve_scorer(name: str, scorers: Mapping[str, Scorer] = SCORERS) -> Scorer:
    """The scorer called ``name`` in ``scorers``: names only, never a path to import."""
    if name not in scorers:
        raise ValueError(f"unknown scorer {name!r}: use one of {', '.join(scorers)}")
    return scorers[name]


def _takes_question(function: Scorer) -> bool:
    try:
        return "question" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read (some builtins)
        return False


def score(
    answer: str | None,
    expected: str,
    scorer: str = "exact",
    scorers: Mapping[str, Scorer] = SCORERS,
    question: str = "",
) -> float:
    """The answer's score in [0, 1]; a missing answer scores 0.0 (the scorer name is checked all the same).

    A scorer with a ``question`` parameter (the judge) is given the task's question too. A scorer that
    cannot score raises ``ScoringError`` with the reason.
    """
    function = resolve_scorer(scorer, scorers)
    if answer is None:
        return 0.0
    try:
        if _takes_question(function):
            value = float(function(answer, expected, question=question))
        else:
            value = float(function(answer, expected))
    except (ifeval.InstructionError, judge.JudgeError) as exc:
        raise ScoringError(f"scorer {scorer!r}: {exc}") from None
    return 0.0 if math.isnan(value) else min(max(value, 0.0), 1.0)
