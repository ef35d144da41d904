"""`jailbox bench` on the reference benchmark's data: its rows load as they are and score as its scorers do.

The verdicts pinned here are the reference's (llm-in-sandbox 1c9f7a9, benchmark/*/reward.py and judge.py),
worked out by running its functions on the same answers. The reference publishes no ground truth with its
examples, so the ground truths of the example rows are made up (said where they are).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import need
from support.batch_tasks import ROOT, bench_command
from support.llm_server import ScriptedServer, Step, error, reply

from jailbox.agent import llm_prompt
from jailbox.agent.batch import Batch, BatchConfig
from jailbox.agent.environment import Environment
from jailbox.agent.judge import Judge, JudgeConfig, from_flags, verdict
from jailbox.agent.llm import LLMConfig
from jailbox.agent.scoring import ScoringError, load_scorers, score
from jailbox.agent.tasks import Task, check_task, load_tasks, read_results

pytestmark = pytest.mark.once  # scorers run on the host, the same whoever runs them

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
EXAMPLES = SHARED / "reference-examples"
TRAJECTORIES = SHARED / "reference-trajectories"
NO_KWARGS = dict.fromkeys(("N", "keyword", "num_sentences", "relation", "end_phrase", "word"))


def _examples() -> Path:
    need("shared-data")
    return EXAMPLES


def _prompt(name: str) -> str:
    return (_examples() / name / "prompt.txt").read_text()


def _instructions(*ids: str) -> str:
    """A ground truth as the reference's instruct_follow rows hold it: IFBench's ids, every argument named."""
    return json.dumps({"instruction_id_list": list(ids), "kwargs": [dict(NO_KWARGS) for _ in ids]})


# --- multiple choice ---------------------------------------------------------------------------------

# (answer, ground truth, the reference's verdict); the jailbox scorer before this change disagreed on 9 of 25
CHOICE_VERDICTS = [
    ("A", "A", 1.0),
    ("a", "A", 1.0),
    ("A\n", "A", 1.0),
    ('"answer": "A"', "A", 1.0),
    ('{"answer": "b"}', "B", 1.0),
    ("Answer: C", "C", 1.0),
    ("answer\uff1ad", "D", 1.0),  # a full-width colon
    ("The answer is B", "B", 1.0),
    ("The correct choice is c.", "C", 1.0),
    (r"\boxed{A}", "A", 1.0),
    (r"\boxed{\text{B}}", "B", 1.0),
    ("(B) 16 months", "B", 1.0),
    ("B. 16 months", "B", 1.0),
    ("The answer is (B).", "B", 1.0),
    ("The answer is **E**.", "E", 1.0),
    ("I think it is B, not D", "B", 0.0),  # the last lone letter decides
    ("Option A", "A", 1.0),
    ("None of these", "A", 0.0),
    ("e.g. A", "A", 1.0),
    ("True.", "TRUE", 0.0),
    ("B, C", "B", 0.0),
    ("answer: B because", "B", 1.0),
    ("The answer is a dog", "A", 1.0),
    ("16 months (B)", "B", 1.0),
    ("Final: (A)", "A", 1.0),
]


@pytest.mark.parametrize(("answer", "expected", "verdict"), CHOICE_VERDICTS)
def test_choice_gives_the_reference_verdict(answer, expected, verdict):
    assert score(answer, expected, "choice") == verdict


@pytest.mark.parametrize("example", ["05_chemical_analysis", "06_biomed_qa"])
def test_choice_on_the_example_prompts_options(example):
    prompt = _prompt(example)
    inline = re.findall(r"\(([A-J])\) (\d+ months)", prompt)  # biomed: (A) 18 months (B) ...
    lines = re.findall(r"^([A-D])\. (\S+)$", prompt, flags=re.MULTILINE)  # chemistry: A. SMILES
    assert inline or lines
    for letter, text in inline:
        assert score(f"({letter}) {text}", letter, "choice") == 1.0
        assert score(f"{text} ({letter})", letter, "choice") == 1.0
        assert score(f"The answer is {text}", letter, "choice") == 0.0  # no letter in it at all
    for letter, smiles in lines:
        # the reference reads an echoed option line by the last lone letter of the SMILES: an atom, C or O
        assert score(f"{letter}. {smiles}", letter, "choice") == float(letter == "C")
    field = re.search(r'"answer": "([A-Z])"', prompt)
    assert field and score(field.group(0), field.group(1), "choice") == 1.0


# --- instruction following ---------------------------------------------------------------------------


def _instruct_answer() -> str:
    need("shared-data")
    steps = json.loads((TRAJECTORIES / "trajectory_instruct.json").read_text())["steps"]
    written = [
        s["action"]["parameters"]["file_text"]
        for s in steps
        if s["action"]["parameters"].get("path", "").endswith("answer.txt")
        and s["action"]["parameters"].get("command") == "create"
    ]
    return written[-1]


def test_the_instruct_examples_answer_scores_as_the_reference_scores_it():
    answer = _instruct_answer()
    assert "three sentences, all containing the same number of characters" in _prompt("10_instruct_follow")
    # three sentences of 27 characters: IFBench's ratio:sentence_words holds (the id of this instruction there)
    assert score(answer, _instructions("ratio:sentence_words"), "instructions") == 1.0
    # IFBench pairs it with stairs of indents in its own data. Its loose rule also tries the answer without its
    # first and last lines: here that is one line, a staircase of one step, so the reference passes it too.
    both = _instructions("format:line_indent", "ratio:sentence_words")
    assert score(answer, both, "instructions") == 1.0
    flat = "\n".join(["Intro line.", *answer.split("\n"), "Outro line."])
    assert score(flat, _instructions("format:line_indent"), "instructions") == 0.0
    stairs = "\n".join(" " * (2 * i) + line for i, line in enumerate(flat.split("\n")))
    assert score(stairs, _instructions("format:line_indent"), "instructions") == 1.0
    assert score(answer.replace("Europe", "Germany"), _instructions("ratio:sentence_words"), "instructions") == 0.0


@pytest.mark.parametrize(
    ("answer", "instruction", "kwargs", "verdict"),
    [
        # loose rule: a first or last line of chatter, or markdown stars, do not count against the answer
        ('Sure! Here it is:\n"Quoted answer"', "startend:quotation", {}, 1.0),
        ('"Quoted answer"\nHope this helps.', "startend:quotation", {}, 1.0),
        ("A **bold** claim, then more", "punctuation:no_comma", {}, 0.0),
        ("one two three four", "length_constraints:number_words", {"num_words": 4, "relation": "at least"}, 1.0),
        ("one two three four", "length_constraints:number_words", {"num_words": 4, "relation": "less than"}, 0.0),
        ("Hi.\nThat is all", "startend:end_checker", {"end_phrase": "That is all"}, 1.0),
        ("apple APPLE apple", "keywords:frequency", {"keyword": "apple", "frequency": 3, "relation": "at least"}, 1.0),
        ("no (regex) here", "keywords:existence", {"keywords": ["(regex)"]}, 1.0),
        ("p1 *** p2 *** p3", "length_constraints:number_paragraphs", {"num_paragraphs": 3}, 1.0),
        ("a\n  b\n\n\n    c\n      d", "format:line_indent", {}, 0.0),  # of two blank lines one stays, as in IFBench
        ("a\n  b\n\n    c\n      d", "format:line_indent", {}, 1.0),
        (
            "SECTION 1 a\nSECTION 2 b",
            "detectable_format:multiple_sections",
            {"section_spliter": "SECTION", "num_sections": 2},
            1.0,
        ),
        (
            "x\n\nWorld, big.",
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "world"},
            1.0,
        ),
        ("same\n******\nsame", "combination:two_responses", {}, 0.0),
        ("My answer is maybe.", "detectable_format:constrained_response", {}, 1.0),
    ],
)
def test_instruction_checks(answer, instruction, kwargs, verdict):
    expected = json.dumps({"instruction_id_list": [instruction], "kwargs": [kwargs]})
    assert score(answer, expected, "instructions") == verdict


def test_an_instruction_without_a_check_is_an_error_naming_it_not_a_zero():
    with pytest.raises(ScoringError, match=r"'count:person_names' has no check here"):
        score("text", _instructions("ratio:sentence_words", "count:person_names"), "instructions")
    bad_relation = json.dumps(
        {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 1, "relation": "≈"}]}
    )
    with pytest.raises(ScoringError, match="relation"):
        score("text", bad_relation, "instructions")
    assert score("text", "not json", "instructions") == 0.0  # as the reference scores a broken ground truth
    assert score("text", "[" * 100_000, "instructions") == 0.0  # no RecursionError out of a batch's scoring


def test_an_answer_too_deep_to_parse_is_not_json_format():
    """A model's answer nested deeper than the parser recurses raised RecursionError out of the check."""
    for answer in ("[" * 100_000, "```json\n" + "[" * 100_000 + "\n```"):
        assert score(answer, _instructions("detectable_format:json_format"), "instructions") == 0.0
    assert score('```json\n{"a": [1]}\n```', _instructions("detectable_format:json_format"), "instructions") == 1.0


# --- the reference's rows, loaded unchanged ----------------------------------------------------------


def _documents() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((_examples() / "09_long_context" / "input").iterdir())}


def _reference_rows() -> list[dict]:
    """Rows as the reference's dataset has them; the ground truths are made up (none is published)."""
    return [
        {"id": 5, "domain": "chem", "problem_statement": _prompt("05_chemical_analysis"), "ground_truth": "A"},
        {"id": 6, "domain": "biomed", "problem_statement": _prompt("06_biomed_qa"), "ground_truth": "B"},
        {"id": 7, "domain": "physics", "problem_statement": _prompt("07_physics_reasoning"), "ground_truth": "d"},
        {"id": 8, "domain": "math", "problem_statement": _prompt("08_math_problem"), "ground_truth": "588"},
        {
            "id": 9,
            "domain": "long_context",
            "problem_statement": _prompt("09_long_context"),
            "ground_truth": "Airline industry",
            "input_files": json.dumps(_documents()),  # a JSON string, as the dataset stores it
        },
        {
            "id": 10,
            "domain": "instruct_follow",
            "problem_statement": _prompt("10_instruct_follow"),
            "ground_truth": _instructions("ratio:sentence_words"),
            "input_files": {"unused.txt": None},
        },
        {"id": "demo_004", "domain": "demo", "problem_statement": "sum", "ground_truth": "42", "input_files": {}},
    ]


def test_reference_rows_load_with_their_domains_scorers(tmp_path):
    path = tmp_path / "TASKS.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in _reference_rows()))
    tasks = {t.id: t for t in load_tasks(path)}
    assert {i: t.scorer for i, t in tasks.items()} == {
        "5": "choice",
        "6": "choice",
        "7": "judge",
        "8": "math",
        "9": "judge",
        "10": "instructions",
        "demo_004": "exact",
    }
    assert tasks["8"].answer == "588" and tasks["5"].query.startswith("How is this IUPAC")
    assert tasks["9"].input_files == _documents() and tasks["10"].input_files == {}
    assert tasks["9"].input_paths("/testbed/documents") == {
        f"/testbed/documents/{n}": c for n, c in _documents().items()
    }
    answers = {"5": "A", "6": '"answer": "B"', "8": r"\boxed{588}", "10": _instruct_answer(), "demo_004": "42\n"}
    scorers = load_scorers()
    for task_id, answer in answers.items():
        task = tasks[task_id]
        check_task(task, scorers)
        assert score(answer, task.answer or "", task.scorer, scorers) == 1.0, task_id
    for task_id in ("7", "9"):  # the judge's tasks are refused up front, naming the flags that set one
        with pytest.raises(ValueError, match=r"--judge-model NAME --judge-base-url URL"):
            check_task(tasks[task_id], scorers)


def test_an_instruction_list_given_as_an_object_is_its_json_text():
    task = Task.model_validate({"id": 1, "problem_statement": "q", "ground_truth": json.loads(_instructions("a:b"))})
    assert json.loads(task.answer or "") == json.loads(_instructions("a:b"))
    with pytest.raises(ValueError, match=r"input_files: a string must be a JSON object, e\.g\."):
        Task.model_validate({"id": 1, "query": "q", "input_files": "{not json"})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("config", "directory"),
    [("benchmark_long_context.yaml", "/testbed/documents"), ("general.yaml", "/testbed/input")],
)
def test_bare_file_names_land_in_the_configs_input_directory_of_a_real_jail(config, directory):
    documents = {**_documents(), "notes/extra.txt": "more\n"}
    task = Task.model_validate(
        {
            "id": "lc",
            "problem_statement": "q",
            "ground_truth": "x",
            "input_files": json.dumps(documents),
            "prompt_config": str(_examples() / "config" / config),
        }
    )
    with Environment() as env:
        env.reset(task)
        listing = env.step("execute_bash", {"command": f"cd {directory} && sha256sum * notes/*"}).observation
    for name, text in documents.items():
        assert f"{_sha256(text.encode())}  {name}" in listing


@pytest.mark.parametrize("name", ["..", "../escape.txt", "a/../../escape.txt", "", "./.", "nul\0.txt"])
def test_a_relative_input_name_never_leaves_the_input_directory(name):
    task = Task(id="t", query="q", input_files={name: "x"})
    with pytest.raises(ValueError, match=r"task 't': input_files\[.*\]: a relative name is a file in the input"):
        check_task(task, load_scorers())
    with Environment() as env, pytest.raises(ValueError, match="a relative name"):
        env.reset(task)


# --- the judge ---------------------------------------------------------------------------------------


def _judge(server: ScriptedServer, repeats: int = 1) -> Judge:
    llm = LLMConfig(model="judge", base_url=server.url, api_key="k", backoff_base=0, backoff_max=0)
    return Judge(JudgeConfig(llm=llm, repeats=repeats))


@pytest.mark.parametrize(
    ("reply_text", "expected"),
    [
        ("CORRECT", True),
        ("incorrect", False),
        ("It looks CORRECT at first, but it is INCORRECT.", False),
        ("Not incorrect: correct.", True),
        ("I cannot tell.", None),
        ("x" * 1_000_000 + "CORRECT", True),
    ],
)
def test_the_last_verdict_word_decides(reply_text, expected):
    assert verdict(reply_text) is expected


def test_judge_asks_repeatedly_and_scores_the_mean():
    replies = [reply("CORRECT"), reply("INCORRECT"), reply("Reasoning...\nCORRECT"), reply("unsure")]
    with ScriptedServer(replies) as server:
        scorers = load_scorers(judge_config=_judge(server, repeats=4).config)
        value = score("<think>long</think> s0 = d", "d", "judge", scorers, question="Where does it stop?")
        assert value == 0.5
        assert len(server.requests) == 4
    prompt = server.requests[0].json["messages"][0]["content"]
    assert "Where does it stop?" in prompt and "OFFICIAL ANSWER: d" in prompt
    assert "CANDIDATE ANSWER: s0 = d" in prompt and "long" not in prompt


def test_judge_is_retried_like_the_agents_calls_and_its_failure_is_an_error():
    with ScriptedServer(
        [error(503, "busy"), Step(status=429, json={"error": "slow down"}), reply("CORRECT")]
    ) as server:
        assert _judge(server)("x", "x") == 1.0
        assert len(server.requests) == 3
    with ScriptedServer([error(401, "bad key")]) as server:
        scorers = {"judge": _judge(server)}
        with pytest.raises(ScoringError, match=r"scorer 'judge': the judge at http://127\.0\.0\.1.*bad key"):
            score("x", "x", "judge", scorers)


def test_judge_flags_sample_as_the_reference_judge():
    config = from_flags("qwen3-235b", "http://127.0.0.1:9/v1", "k", 2)
    assert config is not None and (config.llm.temperature, config.llm.max_tokens, config.repeats) == (0.7, 16384, 2)
    assert from_flags(None, None, None, 4) is None
    with pytest.raises(ValueError, match="--judge-base-url and --judge-api-key need --judge-model"):
        from_flags(None, "http://127.0.0.1:9/v1", None, 4)


def _llm_answers(request: dict) -> Step:
    return reply("The answer is B.")


def test_a_batch_judges_each_answer_with_its_question(tmp_path):
    tasks = [
        Task(id="p", query="Where does the block stop?", answer="d", domain="physics"),
        Task(id="q", query="Which industry?", answer="Airline industry", domain="long_context"),
    ]
    with ScriptedServer(responder=_llm_answers) as agent, ScriptedServer(responder=lambda r: reply("CORRECT")) as judge:
        llm = LLMConfig(model="m", base_url=agent.url, api_key="k")
        scorers = load_scorers(judge_config=_judge(judge, repeats=2).config)
        results = Batch(tasks, llm, tmp_path / "out", BatchConfig(mode="llm"), scorers=scorers).run()
    assert sorted((r.id, r.score, r.error) for r in results) == [("p", 1.0, None), ("q", 1.0, None)]
    questions = sorted(r.json["messages"][0]["content"] for r in judge.requests)
    assert len(questions) == 4 and sum("Where does the block stop?" in q for q in questions) == 2


def test_a_batch_records_a_judge_it_cannot_reach_as_the_tasks_error(tmp_path):
    tasks = [Task(id="p", query="q", answer="d", domain="physics")]
    with ScriptedServer(responder=_llm_answers) as agent, ScriptedServer(responder=lambda r: error(400, "no")) as judge:
        llm = LLMConfig(model="m", base_url=agent.url, api_key="k")
        scorers = load_scorers(judge_config=_judge(judge).config)
        [result] = Batch(tasks, llm, tmp_path / "out", BatchConfig(mode="llm"), scorers=scorers).run()
    assert result.score == 0.0 and result.error is not None and "scorer 'judge'" in result.error


def test_bench_command_line_judges_with_the_judge_flags_and_refuses_without_them(tmp_path):
    rows = [
        {"id": "p1", "domain": "physics", "problem_statement": "Where does it stop?", "ground_truth": "d"},
        {"id": "c1", "domain": "chem", "problem_statement": "Pick: (A) x (B) y", "ground_truth": "B"},
    ]
    path = tmp_path / "TASKS.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with ScriptedServer(responder=_llm_answers) as agent, ScriptedServer(responder=lambda r: reply("CORRECT")) as judge:
        refused = subprocess.run(
            bench_command(path, agent.url, tmp_path / "no", "--mode", "llm"), cwd=ROOT, capture_output=True, text=True
        )
        assert refused.returncode == 2 and not agent.requests
        assert "task 'p1': scorer 'judge' needs a judge model: pass --judge-model NAME" in refused.stderr
        flags = ["--mode", "llm", "--judge_model", "j", "--judge_base_url", judge.url, "--judge-repeats", "1"]
        done = subprocess.run(
            bench_command(path, agent.url, tmp_path / "out", *flags), cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    assert {r.id: r.score for r in read_results(tmp_path / "out" / "results.jsonl")} == {"p1": 1.0, "c1": 1.0}
    assert len(judge.requests) == 1 and judge.requests[0].json["temperature"] == 0.7


# --- the plain-LLM prompt ----------------------------------------------------------------------------


def _prompts_sent(tmp_path: Path, tasks: list[Task], root: Path | None = None) -> dict[str, str]:
    with ScriptedServer(responder=_llm_answers) as server:
        llm = LLMConfig(model="m", base_url=server.url, api_key="k")
        results = Batch(tasks, llm, tmp_path / "out", BatchConfig(mode="llm", inputs_root=root)).run()
    assert all(r.error is None for r in results), [r.error for r in results]
    sent = [r.json["messages"][0]["content"] for r in server.requests]
    return {t.id: next(p for p in sent if t.query in p) for t in tasks}


def test_plain_llm_asks_for_a_box_only_where_the_scorer_reads_one(tmp_path):
    tasks = [
        Task(id="m", query="What is 2+2?", answer="4", domain="math"),
        Task(id="c", query="Pick one: (A) x (B) y", answer="B", domain="chem"),
        Task(id="i", query="Write three sentences.", answer=_instructions("punctuation:no_comma"), domain="instruct"),
        Task(id="e", query="Capital of France?", answer="Paris"),
    ]
    sent = _prompts_sent(tmp_path, tasks)
    assert "\\boxed{}" in sent["m"]
    assert all("boxed" not in sent[k] and sent[k] == t.query for k, t in zip("cie", tasks[1:], strict=True))


def test_plain_llm_gets_the_documents_inline_and_from_files_beneath_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "report.txt").write_text("The airline industry grew.")
    task = Task(
        id="d",
        query="Which industry grew?",
        answer="airline",
        domain="long_context",
        scorer="rouge_l",
        input_files={"notes.txt": "Hotels shrank.", "report.txt": "@docs/report.txt", "all": "@docs"},
    )
    prompt = _prompts_sent(tmp_path, [task], root)["d"]
    assert "Hotels shrank." in prompt and "The airline industry grew." in prompt
    assert prompt.index("notes.txt") < prompt.index("report.txt") < prompt.index("Which industry grew?")
    assert "a directory: its files are not in this prompt" in prompt


def test_plain_llm_documents_are_bounded_and_a_cut_is_said(tmp_path, monkeypatch):
    monkeypatch.setattr(llm_prompt, "DOCUMENT_CHARS", 1000)
    root = tmp_path / "root"
    root.mkdir()
    (root / "big.txt").write_text("b" * 5000)
    task = Task(id="b", query="q", input_files={"a.txt": "a" * 600, "big.txt": "@big.txt", "c.txt": "c" * 10})
    prompt = llm_prompt.build(task, root)
    assert prompt.count("a") >= 600 and prompt.count("b") < 500 and "ccc" not in prompt
    assert "[big.txt is cut here: a prompt holds at most 1000 characters of documents]" in prompt
    assert "[c.txt is cut here" in prompt and "[a.txt is cut here" not in prompt


@pytest.mark.parametrize("how", ["file", "directory"])
def test_plain_llm_never_reads_a_document_through_a_symlink(tmp_path, how):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("TOPSECRET")
    root = tmp_path / "root"
    root.mkdir()
    if how == "file":
        os.symlink(secret / "key.txt", root / "doc.txt")
        value = "@doc.txt"
    else:
        os.symlink(secret, root / "docs")
        value = "@docs/key.txt"
    task = Task(id="s", query="q", input_files={"doc.txt": value})
    with pytest.raises(ValueError, match="is a symlink, which is not followed"):
        llm_prompt.build(task, root)
    with ScriptedServer(responder=_llm_answers) as server:
        llm = LLMConfig(model="m", base_url=server.url, api_key="k")
        [result] = Batch([task], llm, tmp_path / "out", BatchConfig(mode="llm", inputs_root=root)).run()
    assert "symlink" in (result.error or "") and not any("TOPSECRET" in json.dumps(r.json) for r in server.requests)
