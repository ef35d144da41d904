"""Answer scorers, on the answer formats that the reference trajectories and example tasks use."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
from conftest import need

from jailbox.agent.scoring import (
    SCORERS,
    choice_letter,
    choice_set,
    last_boxed,
    load_scorers,
    resolve_scorer,
    rouge_l,
    score,
)

pytestmark = pytest.mark.once  # scorers run on the host, the same whoever runs them

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
TRAJECTORIES = SHARED / "reference-trajectories"
EXAMPLES = SHARED / "reference-examples"


def _reference(path: Path) -> Path:
    need("shared-data")
    assert path.exists(), f"{path} is missing from the reference data"
    return path


def _answers_written(name: str) -> list[str]:
    """What a reference trajectory wrote into answer.txt, in order: creates, edits and `echo -n X >`."""
    data = json.loads(_reference(TRAJECTORIES / name).read_text())
    answers = []
    for step in data["steps"]:
        parameters = step["action"]["parameters"]
        if parameters.get("path", "").endswith("/answer.txt"):
            if parameters["command"] == "create":
                answers.append(parameters["file_text"])
            elif parameters["command"] == "str_replace":
                answers.append(parameters["new_str"])
        elif echoed := re.fullmatch(r"echo -n (\S+) > \S*/answer\.txt", parameters.get("command", "")):
            answers.append(echoed.group(1))
    return answers


def _prompt(example: str) -> str:
    return _reference(EXAMPLES / example / "prompt.txt").read_text()


# --- the reference answers ---------------------------------------------------------------------------


def test_math_trajectory_answer_is_boxed_588_and_scores():
    answer = _answers_written("trajectory_math.json")[-1]
    assert answer == r"\boxed{588}"
    assert last_boxed(answer) == "588"
    assert score(answer, "588", "math") == 1.0
    assert score(answer, r"\boxed{588}", "math") == 1.0
    assert score(answer, "588.0", "math") == 1.0
    assert score(answer, "587", "math") == 0.0
    assert score(answer, "588", "exact") == 0.0  # exact match does not look inside boxes


def test_chemical_trajectory_answer_is_a_letter():
    answers = _answers_written("trajectory_chemical.json")
    assert answers == ["A", "A"]  # a no-op str_replace, then `echo -n A > answer.txt`
    assert choice_letter(answers[-1]) == "A"
    assert score(answers[-1], "A", "choice") == 1.0
    assert score(answers[-1], "C", "choice") == 0.0


@pytest.mark.parametrize("example", ["05_chemical_analysis", "06_biomed_qa"])
def test_answer_field_format_from_the_example_prompts(example):
    field = re.search(r'"answer": "[A-Z]"', _prompt(example))
    assert field, f"{example}/prompt.txt no longer shows the answer field format"
    letter = field.group(0)[-2]
    assert choice_letter(field.group(0)) == letter
    assert score(field.group(0), letter, "choice") == 1.0


def test_biomed_options_up_to_j_are_read_as_letters():
    options = re.findall(r"\(([A-J])\) (\d+ months)", _prompt("06_biomed_qa"))
    assert [letter for letter, _ in options] == list("ABCDEFGHIJ")
    for letter, text in options:
        assert choice_letter(f"({letter}) {text}") == letter
        assert choice_letter(f"({letter.lower()})") == letter


def test_chemistry_option_lines_are_read_as_the_reference_reads_them():
    options = re.findall(r"^([A-D])\. (\S+)$", _prompt("05_chemical_analysis"), flags=re.MULTILINE)
    assert [letter for letter, _ in options] == list("ABCD")
    # A whole option line echoed back is read by its last lone letter, an atom of the SMILES (the reference's
    # rule 5), not by the option letter; the letter alone, as the prompt asks, is read right.
    assert [choice_letter(f"{letter}. {smiles}") for letter, smiles in options] == list("COCC")
    for letter, _ in options:
        assert choice_letter(letter) == letter
        assert score(f'{{"answer": "{letter}"}}', letter, "choice") == 1.0


def test_physics_prompt_final_answer_sentence():
    sentence = re.search(r"So the final answer is \\boxed\{answer\}\.", _prompt("07_physics_reasoning"))
    assert sentence, "07_physics_reasoning/prompt.txt no longer asks for the final answer sentence"
    assert last_boxed(sentence.group(0)) == "answer"
    filled = sentence.group(0).replace("answer}", r"s_0 = d - \frac{m g \sin\alpha}{k}}")
    assert last_boxed(filled) == r"s_0 = d - \frac{m g \sin\alpha}{k}"
    assert score(filled, r"d-\frac{mg\sin\alpha}{k}", "math") == 1.0


def test_physics_sub_answers_are_compared_in_order():
    # benchmark_physics.yaml asks for \boxed{answer_1, answer_2, ..., answer_n}; these values are made up
    assert score(r"\boxed{2, \frac{1}{2}}", "2, 0.5", "math") == 1.0
    assert score(r"\boxed{\frac{1}{2}, 2}", "2, 0.5", "math") == 0.0
    assert score(r"\boxed{2, \frac{1}{2}, 3}", "2, 0.5", "math") == 0.0


def test_long_context_answer_lines():
    answer = _answers_written("trajectory_longcontext.json")[-1]
    assert answer == "airline industry\nAccommodation industry"
    # The reference's ground truth is not published with the trajectory; these expectations are made up.
    assert score(answer, "Airline industry Accommodation industry", "exact") == 1.0
    assert score(answer, "Airline industry\nAccommodation industry.", "rouge_l") == 1.0
    assert choice_set(answer) == {"airline industry", "accommodation industry"}
    assert score(answer, "Airline industry", "f1") == pytest.approx(2 / 3)


def test_instruction_following_answer_rouge():
    answer = _answers_written("trajectory_instruct.json")[-1]
    assert answer == "Franks shaped Christianity.\nCharlemagne defined Europe.\nFeudalism revived learning."
    # 9 words against 3, all 3 in order: P = 1/3, R = 1, F = 2PR / (P + R) = 0.5
    assert rouge_l(answer, "Charlemagne defined Europe.") == pytest.approx(0.5)


# --- extraction --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (r"\boxed{588}", "588"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"first \boxed{1} then \boxed{ 2 }", "2"),
        (r"\fbox{3}", "3"),
        (r"$\boxed 5$", "5"),
        (r"\boxed{}", ""),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{7} and a broken \boxed{8", "7"),
        ("588", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("A", "A"),
        ("A\n", "A"),
        ("(b)", "B"),
        ("Answer: C", "C"),
        (r"\boxed{D}", "D"),
        (r"\boxed{\text{D}}", "D"),
        ("The answer is **E**.", "E"),
        ("The answer is (d).", "D"),
        ("B. 16 months", "B"),
        # the reference's rules are lenient: a one-letter word after "answer is", the last lone letter anywhere
        ("The answer is a dog", "A"),
        ("e.g. nothing", "G"),
        ("", None),
        ("42", None),
    ],
)
def test_choice_letter(text, letter):
    assert choice_letter(text) == letter


def test_choice_with_an_expected_answer_that_is_no_letter_compares_the_text_as_the_reference_does():
    assert score("  true\n", "TRUE", "choice") == 1.0  # the whole answer, case aside
    assert score("True.", "true", "choice") == 0.0  # no full stop dropped: the reference reads T here
    assert score("False", "true", "choice") == 0.0


# --- multiple answers: no multi-answer task is among the reference data, so these formats are made up --


@pytest.mark.parametrize(
    "text", ["A, C", "{A,C}", r"\boxed{A,C}", "AC", "A and C", "A C", "Answer: A, C", r"\{A, C\}", "(a), (c)"]
)
def test_choice_set_formats(text):
    assert choice_set(text) == {"a", "c"}


@pytest.mark.parametrize(
    ("answer", "expected", "value"),
    [
        ("A, B", "A, C", 0.5),
        ("A, C", "AC", 1.0),
        ("A", "A, C", 2 / 3),
        ("B, D", "A, C", 0.0),
        ("A, B, C, D", "A", 0.4),
        ("", "", 1.0),
    ],
)
def test_f1_partial_credit(answer, expected, value):
    assert score(answer, expected, "multi_choice") == pytest.approx(value)
    assert score(answer, expected, "f1") == pytest.approx(value)


# --- math --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (r"\frac{1}{2}", "0.5"),
        ("1/2", r"\frac{1}{2}"),
        (r"\dfrac12", "0.5"),
        (r"\boxed{\tfrac{1}{2}}", "1/2"),
        (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}"),
        (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}"),
        (r"\sqrt[3]{8}", "2"),
        ("(1, 2)", r"\left(1,2\right)"),
        (r"(-\infty, 3]", r"\left(-\infty,3\right]"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        ("1,000", "1000"),
        (r"1{,}000", "1000"),
        (r"1\,000", "1000"),
        ("588.0", "588"),
        (r"50\%", "50"),
        (r"\$5", "5"),
        (r"5\text{ cm}^2", "5"),
        (r"12 \mathrm{m/s}", "12"),
        (r"\text{yes}", "yes"),
        (r"\boxed{x = 5}", "5"),
        (r"2\pi r", r"2 r \pi"),
        ("x^2+2x+1", "(x+1)^2"),
        (r"\frac{\lambda}{2}", r"0.5\lambda"),
        (r"\cos^2 x + \sin^2 x", "1"),
        (r"2 \cdot 3", "6"),
        (r"2 \times 10^{3}", "2000"),
        (r"e^{2}", "7.38905609893065"),
        ("0.3333333333", r"\frac{1}{3}"),
        ("  \\boxed{588}\n", "588."),
    ],
)
def test_math_equivalences(answer, expected):
    assert score(answer, expected, "math") == 1.0
    assert score(expected, answer, "math") == 1.0


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("589", "588"),
        (r"\frac{1}{3}", "0.333"),
        ("(1, 2)", "(2, 1)"),
        ("(1, 2)", "[1, 2]"),
        ("(1, 2)", "(1, 2, 3)"),
        ("1, 2", "(1, 2)"),
        ("x+1", "x+2"),
        (r"\sqrt{2}", "1.414"),
        (r"\boxed{}", "0"),
        ("", "0"),
        ("yes", "no"),
    ],
)
def test_math_non_equivalences(answer, expected):
    assert score(answer, expected, "math") == 0.0


def test_math_never_evaluates_code_or_huge_powers(tmp_path):
    marker = tmp_path / "marker"
    assert score(f"\\boxed{{__import__('os').system('touch {marker}')}}", "0", "math") == 0.0
    assert not marker.exists()
    assert score("9^{9^{9}}", "1", "math") == 0.0
    assert score("2^{100000}", "1", "math") == 0.0


def test_math_verify_decides_first_when_installed(monkeypatch):
    accepting = types.SimpleNamespace(parse=lambda text: text, verify=lambda gold, answer: True)
    monkeypatch.setitem(sys.modules, "math_verify", accepting)
    assert score("anything", "588", "math") == 1.0


def test_math_verify_errors_and_rejections_fall_back_to_the_builtin(monkeypatch):
    def broken(text):
        raise RuntimeError("signal only works in main thread")

    monkeypatch.setitem(sys.modules, "math_verify", types.SimpleNamespace(parse=broken, verify=None))
    assert score(r"\boxed{588}", "588", "math") == 1.0
    rejecting = types.SimpleNamespace(parse=lambda text: text, verify=lambda gold, answer: False)
    monkeypatch.setitem(sys.modules, "math_verify", rejecting)
    assert score(r"\frac{1}{2}", "0.5", "math") == 1.0
    assert score("3", "0.5", "math") == 0.0


# --- exact and ROUGE-L -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected", "value"),
    [
        ("  Paris.\n", "paris", 1.0),
        ("New   York", "new york", 1.0),
        ("Paris", "Lyon", 0.0),
        ("Paris!", "Paris", 0.0),
    ],
)
def test_exact(answer, expected, value):
    assert score(answer, expected) == value


@pytest.mark.parametrize(
    ("answer", "expected", "value"),
    [
        # LCS "the cat on the mat" = 5 of 6 words each way
        ("The cat sat on the mat.", "the cat is on the mat", 5 / 6),
        # LCS "a c" = 2: P = 2/4, R = 2/2, F = 2/3
        ("a b c d", "a c", 2 / 3),
        # LCS 1 ("b" or "a"): P = R = 1/2
        ("a b", "b a", 0.5),
        ("Hello, world!", "hello world", 1.0),
        ("completely different", "nothing shared", 0.0),
        ("", "something", 0.0),
        ("...", "", 1.0),
    ],
)
def test_rouge_l(answer, expected, value):
    assert score(answer, expected, "rouge_l") == pytest.approx(value)


# --- the registry ------------------------------------------------------------------------------------


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    (tmp_path / "my_scorers.py").write_text(
        "def half(answer, expected):\n    return 0.5\n\n"
        "def generous(answer, expected):\n    return 7\n\n"
        "def harsh(answer, expected):\n    return -1\n\n"
        "def undefined(answer, expected):\n    return float('nan')\n\n"
        "THRESHOLD = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_scorers"


def test_custom_scorers_by_name_from_a_module_the_user_names(custom_module):
    scorers = load_scorers([custom_module])
    assert score("x", "y", "half", scorers) == 0.5
    assert score("x", "y", "generous", scorers) == 1.0
    assert score("x", "y", "harsh", scorers) == 0.0
    assert score("x", "y", "undefined", scorers) == 0.0
    assert scorers["rouge_l"] is SCORERS["rouge_l"] and "THRESHOLD" not in scorers


@pytest.mark.parametrize(
    "name", ["my_scorers:half", "my_scorers.half", "jailbox.agent.scoring:rouge_l", "jailbox.agent.scoring.math_equal"]
)
def test_a_dotted_path_is_no_scorer_name(custom_module, name):
    with pytest.raises(ValueError, match="unknown scorer"):
        resolve_scorer(name, load_scorers([custom_module]))


def test_a_scorer_module_that_cannot_be_imported(custom_module):
    with pytest.raises(ValueError, match="cannot import"):
        load_scorers(["no_such_package.module"])


def test_a_scorer_module_cannot_take_a_built_in_name(custom_module, tmp_path):
    (tmp_path / "clashing.py").write_text("def exact(answer, expected):\n    return 1.0\n")
    with pytest.raises(ValueError, match="'exact' from module clashing clashes with the one from built-in"):
        load_scorers(["clashing"])


@pytest.mark.parametrize("name", ["bleu", "", "Exact"])
def test_unknown_scorer_names_list_the_known_ones(name):
    with pytest.raises(ValueError, match="unknown scorer") as error:
        score("A", "A", name)
    for known in ("exact", "choice", "multi_choice", "f1", "math", "rouge_l"):
        assert known in str(error.value)


@pytest.mark.parametrize("scorer", sorted(SCORERS))
def test_missing_answers_score_zero(scorer):
    assert score(None, "A", scorer) == 0.0
    assert score(None, "", scorer) == 0.0


def test_missing_answer_with_an_unknown_scorer_still_raises():
    with pytest.raises(ValueError, match="unknown scorer"):
        score(None, "A", "bleu")
