"""``jailbox bench`` (many tasks, scored) and ``jailbox replay`` (a recorded run again, compared).

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import click

from ..sandbox.errors import SandboxError  # stdlib only, and every command catches it
from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it
from .app import main
from .errors import SETUP_EXIT, _check_url, _fed_by, _flag_error, fail
from .options import (
    COPY_OUT_HELP,
    ROOTFS_DEFAULT_HELP,
    RUN_NETWORK_HELP,
    _agent_jail_options,
    _config,
    _endpoint,
    _llm_bound_options,
    _llm_bounds,
    _llm_retries_option,
    _shaped,
    _shaping_options,
    _time_limit_option,
    default_rootfs,
)
from .run import _trim, llm_advice


@main.command("bench")
@click.argument("tasks_file", metavar="TASKS", type=click.Path(exists=True, dir_okay=False))
@click.option("--llm-name", "--llm_name", "--model", "llm_name", required=True, help="Model name at the endpoint.")
@click.option("--llm-base-url", "--llm_base_url", "llm_base_url", default=None, help="Default $OPENAI_BASE_URL.")
@click.option("--api-key", "--api_key", default=None, help="Default $OPENAI_API_KEY.")
@_llm_retries_option
@_llm_bound_options("the model or the judge")
@click.option(
    "--output-dir", "--output_dir", type=click.Path(file_okay=False), default="./bench-out", show_default=True
)
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--executor", type=click.Choice(["threads", "ray"]), default="threads", show_default=True)
@click.option("--ray-address", "--ray_address", default=None, help="Default $RAY_ADDRESS, else a local cluster.")
@click.option("--mode", type=click.Choice(["sandbox", "llm"]), default="sandbox", show_default=True)
@click.option(
    "--resume", is_flag=True, help="Add to OUTPUT_DIR/results.jsonl, skipping what it has for this model and mode."
)
@click.option("--overwrite", is_flag=True, help="Move an earlier run in OUTPUT_DIR aside (to OUTPUT_DIR.DATE) first.")
@click.option("--max-steps", "--max_steps", type=int, default=100, show_default=True)
@_time_limit_option("each task (a task's own time_limit wins)")
@click.option("--rootfs", default=None, help=ROOTFS_DEFAULT_HELP)
@click.option("--network", default="full", show_default=True, metavar="MODE", help=RUN_NETWORK_HELP)
@_shaping_options
@click.option(
    "--scorer-module",
    "--scorer_module",
    "scorer_modules",
    multiple=True,
    metavar="MODULE",
    help="Make MODULE's public functions scorers that tasks may name (repeatable).",
)
@click.option(
    "--inputs-root",
    "--inputs_root",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Where a task's @path input files are [default: the tasks file's directory].",
)
@click.option("--copy-out", "--copy_out", "copy_out", multiple=True, metavar="PATH", help=COPY_OUT_HELP)
@click.option("--judge-model", "--judge_model", default=None, help="Model for tasks scored by 'judge'.")
@click.option(
    "--judge-base-url", "--judge_base_url", default=None, help="The judge's endpoint [default: $OPENAI_BASE_URL]."
)
@click.option("--judge-api-key", "--judge_api_key", default=None, help="The judge's API key.")
@click.option(
    "--judge-repeats", "--num_repeats", type=int, default=4, show_default=True, help="Verdicts averaged per answer."
)
def bench_cmd(
    tasks_file: str,
    llm_name: str,
    llm_base_url: str | None,
    api_key: str | None,
    llm_max_retries: int,
    llm_timeout: float,
    llm_max_reply: str,
    output_dir: str,
    workers: int,
    executor: str,
    ray_address: str | None,
    mode: str,
    resume: bool,
    overwrite: bool,
    max_steps: int,
    time_limit: float | None,
    rootfs: str | None,
    network: str,
    scorer_modules: tuple[str, ...],
    inputs_root: str | None,
    copy_out: tuple[str, ...],
    judge_model: str | None,
    judge_base_url: str | None,
    judge_api_key: str | None,
    judge_repeats: int,
    **shaping: Any,
) -> None:
    """Run every task of TASKS (JSONL) in its own sandbox, N at once, and score the answers.
    Ctrl-C once: running tasks finish, no new one starts; twice: they are killed. TASKS is data: its
    scorers are names (built-in, --scorer-module, or jailbox.scorers entry points) and its @path inputs
    lie beneath --inputs-root.

    \b
    Example:
      jailbox bench tasks.jsonl --llm-name qwen3 --llm-base-url http://localhost:8000/v1 --workers 8
    """
    from pathlib import Path

    from ..agent.batch import Batch, BatchConfig, find_executor
    from ..agent.executors import ExecutorError
    from ..agent.llm import LLMConfig
    from ..agent.loop import AgentConfig
    from ..agent.progress import Progress
    from ..agent.report import common_failure, write_summary
    from ..agent.run import check_copy_out
    from ..agent.scoring import load_scorers
    from ..agent.tasks import load_tasks, read_results
    from ..sandbox import SandboxConfig

    if resume and overwrite:
        _flag_error("--overwrite", "is for a fresh run, --resume adds to the earlier one: give one of them")
    with _fed_by("TASKS"):
        tasks = load_tasks(tasks_file)
    with _fed_by("--llm-base-url"):
        _check_url(llm_base_url)
    from ..agent.judge import from_flags

    bounds = _llm_bounds(llm_max_reply, llm_timeout)
    with _fed_by("--judge-model"):
        judge = from_flags(judge_model, judge_base_url, judge_api_key, judge_repeats, bounds)
    with _fed_by("--scorer-module"):
        scorers = load_scorers(scorer_modules, judge)
    try:
        executor_factory = find_executor(executor)
    except ExecutorError as exc:  # its extra is not installed: said before anything is moved or run
        _flag_error("", str(exc))
    with _fed_by("--copy-out"):
        copy_out = tuple(check_copy_out(rel) for rel in copy_out)
    shaped = _shaped(**shaping)
    out = Path(output_dir)
    if not resume and out.exists() and any(out.iterdir()):
        if not overwrite:
            _flag_error(
                "--output-dir",
                f"{out} holds an earlier run; add --resume to finish it, --overwrite to move it aside, "
                "or name another directory",
            )
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = next(
            path
            for n in range(1000)
            if not (path := out.with_name(f"{out.name}.{stamp}" + (f".{n}" if n else ""))).exists()
        )
        out.rename(aside)
        click.echo(f"jailbox: moved the earlier run in {out} to {aside}", err=True)
    with _fed_by():
        fields = {**_endpoint(llm_name, llm_base_url, api_key), "max_retries": llm_max_retries, **bounds}
        config = BatchConfig(
            workers=workers,
            max_starting=min(workers, 4),
            mode=mode,
            resume=resume,
            ray_address=ray_address,
            inputs_root=Path(inputs_root or Path(tasks_file).parent).resolve(),
            copy_out=list(copy_out),
        )
        batch = Batch(
            tasks,
            LLMConfig(**fields),
            out,
            config,
            SandboxConfig(rootfs=rootfs or default_rootfs(), network=network, **shaped),
            AgentConfig(max_steps=max_steps, time_limit=time_limit),
            executor=executor_factory,
            scorers=scorers,
        )
    pending = len(batch.pending())
    progress = Progress(pending, sys.stdout, already=len(tasks) - pending)
    batch.observer = progress

    def interrupt(*_: object) -> None:
        if batch.stopping.is_set():
            progress.note("jailbox: killing the running tasks")
            batch.kill()
        else:
            progress.note("jailbox: finishing the running tasks (Ctrl-C again to kill them)")
            batch.stop()

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        with progress:
            finished = batch.run()
    except ExecutorError as exc:
        click.echo(printable(f"jailbox: {exc}"), err=True)
        sys.exit(2)
    finally:
        signal.signal(signal.SIGINT, previous)
    click.echo(printable(write_summary(read_results(batch.results_path), Path(output_dir))))
    if batch.stopping.is_set():
        sys.exit(130)  # interrupted: the results file has what finished, --resume does the rest
    cause = common_failure(finished)
    if cause is not None:
        click.echo(printable(f"jailbox: every task failed alike, so nothing was measured: {cause}"), err=True)
        if cause.startswith("llm_error"):
            click.echo(printable(f"jailbox: {llm_advice(cause, batch.job.llm.base_url)}"), err=True)
        sys.exit(1)


@main.command()
@click.argument("trajectories", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@_agent_jail_options
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Per-command timeout.")
@click.option(
    "--input-dir",
    "--input_dir",
    "input_dir",
    type=click.Path(exists=True, file_okay=False),
    help="The task's input files, copied to /testbed/input first, e.g. examples/09_long_context/input.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay(trajectories: tuple[str, ...], timeout: float, input_dir: str | None, as_json: bool, **jail: Any) -> None:
    """Re-run each TRAJECTORY's actions (jailbox's or the reference package's) in a fresh sandbox and report,
    step by step, where the observation or exit code now differs; steps that reach the network and steps that
    differ only in times or order get their own columns. Exit 1 if any step differs.

    \b
    Example:
      jailbox replay out/20260101_120000/trajectory.json --input_dir task/input
    """
    import json
    from pathlib import Path

    from ..agent.inputs import InputDirError
    from ..agent.replay import VERDICTS, StepDiff
    from ..agent.replay import replay as run_replay

    config = _config(**{**jail, "rootfs": jail["rootfs"] or default_rootfs()})
    runs: list[tuple[str, list[StepDiff]]] = []
    for trajectory in trajectories:
        try:
            runs.append((trajectory, run_replay(trajectory, config, timeout=timeout, input_dir=input_dir)))
        except InputDirError as exc:
            _flag_error("--input_dir", str(exc))
        except SandboxError as exc:
            fail(exc, SETUP_EXIT)
    if as_json:
        payload = [{"trajectory": t, "steps": [s.model_dump() for s in steps]} for t, steps in runs]
        click.echo(json.dumps(payload if len(runs) > 1 else payload[0]["steps"]))
    else:
        for trajectory, steps in runs:
            if len(runs) > 1:
                click.echo(printable(f"== {trajectory}", line=True))
            for s in steps:
                line = f"step {s.index:3} {s.verdict:16} {s.action[:90]}" + (f"  ({s.cause})" if s.cause else "")
                click.echo(printable(line, line=True))
                if s.verdict == "differs":
                    click.echo(printable(_trim(s.diff, 1200)))
        names = [printable(Path(t).stem, line=True) for t, _ in runs]
        width = max(len("trajectory"), *map(len, names))
        click.echo(f"{'trajectory':{width}}  steps  " + "  ".join(VERDICTS))
        for name, (_, steps) in zip(names, runs, strict=True):
            cells = "  ".join(f"{sum(s.verdict == v for s in steps):{len(v)}}" for v in VERDICTS)
            click.echo(f"{name:{width}}  {len(steps):5}  {cells}")
        every = [s for _, steps in runs for s in steps]
        counts = {v: sum(s.verdict == v for s in every) for v in VERDICTS}
        click.echo(
            f"{counts['same']} same, {counts['differs']} differ, {counts['network']} used the network, "
            f"{counts['nondeterministic']} nondeterministic"
        )
    sys.exit(1 if any(s.verdict == "differs" for _, steps in runs for s in steps) else 0)
