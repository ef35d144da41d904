"""Instruction-following checks, IFEval and IFBench style: the ``instructions`` scorer.

The reference's instruction-following benchmark scores with IFBench's "loose" rule: an expected answer is a
JSON object ``{"instruction_id_list": [...], "kwargs": [{...}, ...]}``, and the answer scores 1.0 when every
instruction is followed by at least one of five variants of it (as written, without ``*``, without its first
line, without its last, without both). This module is jailbox's own implementation of that rule and of the
checks listed in ``CHECKS``; an instruction it does not know is an error naming it, never a silent 0.

IFBench itself is not on PyPI (the reference clones its repository and needs spaCy and NLTK data downloaded at
run time), so the checks here are written from its descriptions: words are ``\\w+`` runs, as IFBench counts
them, and sentences end at ``.``, ``!`` or ``?`` before whitespace (NLTK's splitter also knows abbreviations,
so a text full of "e.g." may count differently). Keywords are matched literally (IFBench uses them as regular
expressions; a tasks file is data, so a pattern from it is never run).

Runs where a batch scores (the driver) or where an RL environment steps.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..sandbox.errors import AgentError


class InstructionError(AgentError, ValueError):
    """An expected answer names an instruction this module cannot check, or misses one of its arguments."""


_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_RELATIONS = ("less than", "at least")


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def _compare(count: int, relation: str, threshold: int) -> bool:
    if relation not in _RELATIONS:
        raise InstructionError(f"relation {relation!r}: use one of {', '.join(map(repr, _RELATIONS))}")
    return count < threshold if relation == "less than" else count >= threshold


def _keywords_exist(text: str, keywords: list[str]) -> bool:
    return all(re.search(re.escape(k), text, re.IGNORECASE) for k in keywords)


def _keyword_frequency(text: str, keyword: str, frequency: int, relation: str) -> bool:
    return _compare(len(re.findall(re.escape(keyword), text, re.IGNORECASE)), relation, frequency)


def _forbidden_words(text: str, forbidden_words: list[str]) -> bool:
    return not any(re.search(rf"\b{re.escape(w)}\b", text, re.IGNORECASE) for w in forbidden_words)


def _letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return _compare(text.lower().count(letter.lower()), let_relation, let_frequency)


def _number_words(text: str, num_words: int, relation: str) -> bool:
    return _compare(len(_words(text)), relation, num_words)


def _number_sentences(text: str, num_sentences: int, relation: str) -> bool:
    return _compare(len(_sentences(text)), relation, num_sentences)


def _number_paragraphs(text: str, num_paragraphs: int) -> bool:
    """Paragraphs are split by ``***``; an empty one is allowed only at either end."""
    paragraphs = re.split(r"\s?\*\*\*\s?", text)
    count = len(paragraphs)
    for index, paragraph in enumerate(paragraphs):
        if not paragraph.strip():
            if 0 < index < len(paragraphs) - 1:
                return False
            count -= 1
    return count == num_paragraphs


def _placeholders(text: str, num_placeholders: int) -> bool:
    return len(re.findall(r"\[.*?\]", text)) >= num_placeholders


def _postscript(text: str, postscript_marker: str) -> bool:
    patterns = {"P.P.S": r"\s*p\.\s?p\.\s?s.*$", "P.S.": r"\s*p\.\s?s\..*$"}
    pattern = patterns.get(postscript_marker, r"\s*" + re.escape(postscript_marker.lower()) + r".*$")
    return bool(re.search(pattern, text.lower(), re.MULTILINE))


def _bullet_lists(text: str, num_bullets: int) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", text, re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, re.MULTILINE)
    return len(stars) + len(dashes) == num_bullets


def _highlighted_sections(text: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h[2:-2].strip()]
    return len(single) + len(double) >= num_highlights


def _json_format(text: str) -> bool:
    body = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        body = body.removeprefix(prefix)
    try:
        json.loads(body.removesuffix("```").strip())
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser can tell
        return False
    return True


def _title(text: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", text))


def _end_phrase(text: str, end_phrase: str) -> bool:
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


def _quotation(text: str) -> bool:
    text = text.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


def _no_comma(text: str) -> bool:
    return "," not in text


def _constrained_response(text: str) -> bool:
    return any(option in text.strip() for option in ("My answer is yes.", "My answer is no.", "My answer is maybe."))


def _sections(text: str, section_spliter: str, num_sections: int) -> bool:
    """At least ``num_sections`` headers like ``SECTION 1`` (the argument's spelling is IFEval's)."""
    return len(re.split(r"\s?" + re.escape(section_spliter.strip()) + r"\s?\d+\s?", text)) - 1 >= num_sections


def _nth_paragraph_first_word(text: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    """``num_paragraphs`` paragraphs split by blank lines, the ``nth_paragraph``-th starting with ``first_word``."""
    paragraphs = text.split("\n\n")
    count = sum(1 for p in paragraphs if p.strip())
    if not 0 < nth_paragraph <= count or not paragraphs[nth_paragraph - 1].strip():
        return False
    word = paragraphs[nth_paragraph - 1].split()[0].lstrip("'").lstrip('"')
    first = ""
    for letter in word:
        if letter in ".,?!'\"":
            break
        first += letter.lower()
    return count == num_paragraphs and first == first_word


def _two_responses(text: str) -> bool:
    responses = text.split("******")
    kept = []
    for index, response in enumerate(responses):
        if response.strip():
            kept.append(response.strip())
        elif 0 < index < len(responses) - 1:
            return False
    return len(kept) == 2 and kept[0] != kept[1]


def _repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


def _same_length_sentences(text: str) -> bool:
    """Three sentences of the same number of characters."""
    sentences = [s.strip() for s in _sentences(text)]
    return len(sentences) == 3 and len({len(s) for s in sentences}) == 1


def _stairs(text: str) -> bool:
    """Each line indented by more spaces than the one before, blank lines dropped as IFBench drops them: it
    removes them from the list it is walking, which skips the line after each, so of two blank lines in a
    row one stays (and, with no indent, breaks the stairs)."""
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        if not lines[index].strip():
            lines.remove(lines[index])
        index += 1
    indents = [len(line) - len(line.lstrip(" ")) for line in lines]
    return all(b > a for a, b in itertools.pairwise(indents))


def _no_whitespace(text: str) -> bool:
    return not any(char.isspace() for char in text)


CHECKS: dict[str, Callable[..., bool]] = {
    "keywords:existence": _keywords_exist,
    "keywords:frequency": _keyword_frequency,
    "keywords:forbidden_words": _forbidden_words,
    "keywords:letter_frequency": _letter_frequency,
    "length_constraints:number_words": _number_words,
    "length_constraints:number_sentences": _number_sentences,
    "length_constraints:number_paragraphs": _number_paragraphs,
    "detectable_content:number_placeholders": _placeholders,
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": _bullet_lists,
    "detectable_format:number_highlighted_sections": _highlighted_sections,
    "detectable_format:json_format": _json_format,
    "detectable_format:title": _title,
    "detectable_format:constrained_response": _constrained_response,
    "detectable_format:multiple_sections": _sections,
    "length_constraints:nth_paragraph_first_word": _nth_paragraph_first_word,
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": _repeat_prompt,
    "startend:end_checker": _end_phrase,
    "startend:quotation": _quotation,
    "punctuation:no_comma": _no_comma,
    "ratio:sentence_words": _same_length_sentences,
    "format:line_indent": _stairs,
    "format:no_whitespace": _no_whitespace,
}
"""Instruction ids (IFEval's and IFBench's names) and their checks, called with the instruction's kwargs."""

# IFEval and IFBench name one argument differently in places: the checks take the name in their signature.
_ARGUMENT_NAMES = {"num_sentences_threshold": "num_sentences"}


def _variants(answer: str) -> list[str]:
    lines = answer.split("\n")
    return [
        answer,
        answer.replace("*", ""),
        "\n".join(lines[1:]).strip(),
        "\n".join(lines[:-1]).strip(),
        "\n".join(lines[1:-1]).strip(),
    ]


def _follows(check: Callable[..., bool], instruction: str, arguments: Mapping[str, Any], answer: str) -> bool:
    try:
        return any(variant.strip() and check(variant, **arguments) for variant in _variants(answer))
    except TypeError as exc:
        raise InstructionError(f"instruction {instruction!r}: {exc}") from None


def instructions(answer: str, expected: str) -> float:
    """1.0 when the answer follows every instruction of ``expected`` (IFBench's loose rule), else 0.0.

    ``expected`` that is no JSON scores 0.0, as in the reference; an instruction not in ``CHECKS``, or one
    whose arguments do not fit it, raises ``InstructionError`` naming it.
    """
    try:
        spec = json.loads(expected)
    except (ValueError, RecursionError):
        return 0.0
    if not isinstance(spec, dict):
        raise InstructionError('expected {"instruction_id_list": [...], "kwargs": [...]}')
    ids = spec.get("instruction_id_list") or []
    kwargs = spec.get("kwargs") or [{}] * len(ids)
    if not isinstance(ids, list) or not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise InstructionError("instruction_id_list and kwargs must be lists of the same length")
    unknown = [i for i in ids if not isinstance(i, str) or i not in CHECKS]
    if unknown:
        raise InstructionError(f"instruction {unknown[0]!r} has no check here; known: {', '.join(CHECKS)}")
    for instruction, given in zip(ids, kwargs, strict=True):
        check = CHECKS[instruction]
        if not isinstance(given, dict | None):
            raise InstructionError(f"instruction {instruction!r}: its kwargs must be an object")
        arguments = {_ARGUMENT_NAMES.get(str(k), str(k)): v for k, v in (given or {}).items() if v is not None}
        if not _follows(check, instruction, arguments, answer):
            return 0.0
    return 1.0
