"""The ``jailbox`` command, in the user's process: click commands only (parse, call ``sandbox``/``agent``, print)."""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from .sandbox import Mount, NetworkPolicy, Sandbox, SandboxConfig
from .sandbox.errors import SandboxError
from .sandbox.state import cleanup as cleanup_state
from .sandbox.state import state_dir
from .sandbox.terminal import attach

TIMEOUT_EXIT = 124
SHELL = "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l"
COPY_OUT_HELP = (
    "Also copy PATH (relative to the jail's output directory) into OUTPUT_DIR beside answer.txt (repeatable); "
    "nothing else the jail writes leaves it."
)
SETTINGS_HELP = "YAML with defaults for llm_name, llm_base_url, api_key and prompt_config (the reference's)."
NETWORK_HELP = (
    "none (loopback only), host (unconfined), full (slirp4netns: anywhere but the host and its LAN), "
    "or allow:RULES through jailbox's proxy, e.g. allow:pypi,github,*.example.com,!bad.example.com"
)


def _jail_options(func: Any) -> Any:
    options = [
        click.option(
            "--rootfs",
            default="host",
            show_default=True,
            help='"host", a stored name (jailbox rootfs list) or a directory.',
        ),
        click.option(
            "--bind", "binds", multiple=True, metavar="SRC:DST[:ro|rw]", help="Bind a host path (ro default)."
        ),
        click.option("--workdir", default=None, help="Working directory inside [default: the image's, else /testbed]."),
        click.option("--env", "envs", multiple=True, metavar="K=V", help="Set a variable inside (repeatable)."),
        click.option("--network", default="none", show_default=True, metavar="MODE", help=NETWORK_HELP),
        click.option(
            "--publish",
            "publishes",
            multiple=True,
            metavar="[ADDR:]HOST:JAIL",
            help="With --network full: forward a host port.",
        ),
        click.option("--hostname", default="sandbox", show_default=True),
        click.option(
            "--upper",
            type=click.Choice(["disk", "tmpfs"]),
            default="disk",
            show_default=True,
            help="Where the writable layer lives.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _config(
    rootfs: str,
    binds: tuple[str, ...],
    workdir: str | None,
    envs: tuple[str, ...],
    network: str,
    publishes: tuple[str, ...],
    hostname: str,
    upper: str,
) -> SandboxConfig:
    env = {}
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: expected K=V", param_hint="--env")
        env[key] = value
    try:
        mounts = [Mount.parse(b) for b in binds]
        policy = NetworkPolicy.parse(network)
        if publishes:
            policy = NetworkPolicy(mode=policy.mode, publish=publishes)
        extra = {"workdir": workdir} if workdir else {}
        return SandboxConfig(
            rootfs=rootfs, mounts=mounts, env=env, network=policy, hostname=hostname, upper=upper, **extra
        )
    except (ValidationError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None


def _settings() -> dict[str, Any]:
    """Defaults for any command's options from ~/.config/jailbox/config.yaml (or .toml), e.g.
    ``run: {llm_base_url: http://localhost:8000/v1, llm_name: qwen3}``; flags still win."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "jailbox"
    for name in ("config.yaml", "config.yml", "config.toml"):
        path = base / name
        if not path.exists():
            continue
        if name.endswith(".toml"):
            if sys.version_info >= (3, 11):
                import tomllib

                data = tomllib.loads(path.read_text())
            else:  # tomllib came with 3.11, and jailbox adds no TOML dependency for 3.10
                raise click.UsageError(f"{path}: TOML settings need Python 3.11 or newer; use config.yaml")
        else:
            import yaml

            data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise click.UsageError(f"{path}: expected a section per command, e.g. 'run: {{llm_name: qwen3}}'")
        return {cmd: {k.replace("-", "_"): v for k, v in opts.items()} for cmd, opts in data.items()}
    return {}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main(ctx: click.Context) -> None:
    """jailbox: rootless sandboxes for running untrusted code and LLM agents, without Docker."""
    ctx.default_map = _settings()


@main.command("exec", context_settings={"ignore_unknown_options": True})
@_jail_options
@click.option("--timeout", type=float, default=None, help="Kill the command's whole tree after S seconds.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(command: tuple[str, ...], timeout: float | None, **jail: Any) -> None:
    """Run COMMAND in a fresh sandbox; exit with its exit code (124 on timeout)."""
    config = _config(**jail)
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    out, err = sys.stdout.buffer, sys.stderr.buffer

    def write(stream: Any) -> Any:
        def callback(data: bytes) -> None:
            stream.write(data)
            stream.flush()

        return callback

    try:
        with Sandbox(config) as sb:
            result = sb.exec(list(command), timeout=timeout, stdin=stdin, on_stdout=write(out), on_stderr=write(err))
    except SandboxError as exc:
        click.echo(f"jailbox: {exc}", err=True)
        sys.exit(125)
    if result.timed_out:
        click.echo(f"jailbox: command timed out after {timeout}s and was killed", err=True)
        sys.exit(TIMEOUT_EXIT)
    sys.exit(result.exit_code)


@main.command()
@_jail_options
def shell(**jail: Any) -> None:
    """Open an interactive shell on a pty inside a fresh sandbox."""
    config = _config(**jail)
    try:
        with Sandbox(config) as sb:
            command = sb.exec_tty(["/bin/sh", "-c", SHELL], env={"TERM": os.environ.get("TERM", "xterm")})
            code = attach(command, sys.stdin.fileno(), sys.stdout.fileno())
    except SandboxError as exc:
        click.echo(f"jailbox: {exc}", err=True)
        sys.exit(125)
    sys.exit(code)


def _trim(text: str, limit: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= limit else f"{text[: limit // 2]}\n[...]\n{text[-limit // 2 :]}"


@main.command("run", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--query", "--problem", required=True, help="The task (text, or @FILE to read it from a file).")
@click.option(
    "--llm-name",
    "--llm_name",
    "--model",
    "llm_name",
    default=None,
    help="Model name at the endpoint; a litellm provider prefix (openai/, hosted_vllm/, openrouter/...) is dropped.",
)
@click.option(
    "--llm-base-url",
    "--llm_base_url",
    "llm_base_url",
    default=None,
    help="Endpoint, e.g. http://localhost:8000/v1 (default $OPENAI_BASE_URL or $LLM_BASE_URL).",
)
@click.option("--api-key", "--api_key", default=None, help="Default $OPENAI_API_KEY.")
@click.option("--input-dir", "--input_dir", type=click.Path(exists=True, file_okay=False), default=None)
@click.option("--output-dir", "--output_dir", type=click.Path(file_okay=False), default="./output", show_default=True)
@click.option("--prompt-config", "--prompt_config", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--max-steps", "--max_steps", type=int, default=100, show_default=True)
@click.option(
    "--max-token-limit",
    "--max_token_limit",
    type=click.IntRange(min=1),
    default=65536,
    show_default=True,
    help="Tokens the conversation may hold, checked before each call.",
)
@click.option(
    "--max-tokens-per-call", "--max_tokens_per_call", type=click.IntRange(min=1), default=65536, show_default=True
)
@click.option(
    "--max-format-errors",
    "--max_format_errors",
    type=click.IntRange(min=1),
    default=None,
    help="End after N replies in a row without a usable tool call [default: nudge and go on].",
)
@click.option(
    "--extra-body",
    "--extra_body",
    default=None,
    help="JSON (or a Python literal, as the reference takes it) merged into each request body, e.g. "
    '\'{"chat_template_kwargs": {"thinking": true}}\'.',
)
@click.option("--time-limit", "--time_limit", type=float, default=None, help="Seconds of wall time for the run.")
@click.option("--text-mode", is_flag=True, help="For models without tool calling: one fenced action per reply.")
@click.option("--rootfs", default=None, help='"host", a stored name or a directory [default: host].')
@click.option(
    "--docker-image",
    "--docker_image",
    "docker_image",
    default=None,
    metavar="REF",
    help="Image to run in, pulled into the store unless it is there already (instead of --rootfs).",
)
@click.option("--settings", type=click.Path(exists=True, dir_okay=False), default=None, help=SETTINGS_HELP)
@click.option(
    "--save-litellm-response",
    "--save_litellm_response",
    is_flag=True,
    help="Accepted for the reference's command lines; trajectory.json already holds every reply.",
)
@click.option("--network", default="none", show_default=True, metavar="MODE", help=NETWORK_HELP)
@click.option("--memory", default=None, help="Memory cap for the jail, e.g. 4G.")
@click.option("--copy-out", "--copy_out", "copy_out", multiple=True, metavar="PATH", help=COPY_OUT_HELP)
@click.option("--quiet", is_flag=True, help="No per-step output.")
@click.option("--json", "as_json", is_flag=True, help="Print the final result as JSON.")
def run_cmd(
    query: str,
    llm_name: str | None,
    llm_base_url: str | None,
    api_key: str | None,
    input_dir: str | None,
    output_dir: str,
    prompt_config: str | None,
    temperature: float,
    max_steps: int,
    max_token_limit: int,
    max_tokens_per_call: int,
    max_format_errors: int | None,
    extra_body: str | None,
    time_limit: float | None,
    text_mode: bool,
    rootfs: str | None,
    docker_image: str | None,
    settings: str | None,
    save_litellm_response: bool,
    network: str,
    memory: str | None,
    copy_out: tuple[str, ...],
    quiet: bool,
    as_json: bool,
) -> None:
    """Give a model a fresh sandbox and let it work on QUERY until it submits."""
    from .agent import prompts as prompt_configs
    from .agent.llm import LLMConfig
    from .agent.loop import AgentConfig
    from .agent.run import check_copy_out, run_task
    from .sandbox.config import Limits

    if query.startswith("@"):
        query = Path(query[1:]).read_text()
    if rootfs is not None and docker_image is not None:
        raise click.UsageError("--rootfs and --docker_image both name the filesystem: give one, e.g. --rootfs host")
    defaults = _run_settings(settings)
    llm_name = llm_name or defaults.get("llm_name")
    llm_base_url = llm_base_url or defaults.get("llm_base_url")
    api_key = api_key or defaults.get("api_key")
    prompt_config = prompt_config or defaults.get("prompt_config")
    if not llm_name:
        raise click.UsageError("--llm_name is required (or llm_name in --settings), e.g. --llm_name openai/gpt-4o")
    if save_litellm_response and not quiet and not as_json:
        click.echo("jailbox: --save_litellm_response: every request and reply is in trajectory.json already", err=True)
    model, provider_url = _model_route(llm_name)
    try:
        llm_fields: dict[str, Any] = {
            "model": model,
            "temperature": temperature,
            "max_tokens": max_tokens_per_call,
            "extra_body": _extra_body(extra_body) if extra_body else {},
        }
        if llm_base_url or provider_url:
            llm_fields["base_url"] = llm_base_url or provider_url
        if api_key:
            llm_fields["api_key"] = api_key
        llm = LLMConfig(**llm_fields)
        limits = Limits(memory=memory) if memory else Limits()
        sandbox = SandboxConfig(rootfs=rootfs or "host", network=network, limits=limits)
        agent = AgentConfig(
            max_steps=max_steps,
            max_token_limit=max_token_limit,
            max_format_errors=max_format_errors,
            time_limit=time_limit,
            text_mode=text_mode,
        )
        prompts = prompt_configs.load(prompt_config)
        copy_out = tuple(check_copy_out(rel) for rel in copy_out)
    except (ValidationError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    if docker_image is not None:
        sandbox = sandbox.model_copy(update={"rootfs": _docker_image(docker_image, quiet or as_json)})

    started, tokens = time.monotonic(), [0]

    def show(step: Any) -> None:
        steps.append(step.index)
        tokens[0] += step.prompt_tokens + step.completion_tokens
        if step.reasoning:
            click.echo(click.style(_trim(step.reasoning, 400), dim=True))
        for action, observation in zip(step.actions, step.observations, strict=False):
            click.echo(click.style(f"> {action.function} {_trim(json.dumps(action.parameters), 300)}", fg="cyan"))
            click.echo(_trim(observation))
        if step.note:
            click.echo(click.style(step.note, fg="yellow"))
        status = f"[step {step.index}/{max_steps} | {tokens[0]} tokens | {time.monotonic() - started:.0f}s]"
        click.echo(click.style(status, bold=True))

    def retrying(cause: str) -> None:
        status = f"[step {len(steps) + 1}/{max_steps} | {tokens[0]} tokens | {time.monotonic() - started:.0f}s] {cause}"
        click.echo(click.style(status, fg="yellow", bold=True))

    steps: list[Any] = []
    try:
        trajectory = run_task(
            query,
            llm,
            Path(output_dir),
            input_dir=Path(input_dir) if input_dir else None,
            prompts=prompts,
            agent=agent,
            sandbox=sandbox,
            on_step=None if quiet or as_json else show,
            copy_out=copy_out,
            on_retry=None if quiet or as_json else retrying,
        )
    except SandboxError as exc:
        click.echo(f"jailbox: {exc}", err=True)
        sys.exit(125)
    summary = {
        "exit_status": trajectory.exit_status,
        "answer": trajectory.answer,
        "steps": len(trajectory.steps),
        "tokens": trajectory.prompt_tokens + trajectory.completion_tokens,
        "error": trajectory.error,
        "output_dir": str(Path(output_dir).resolve()),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"{trajectory.exit_status}: answer={trajectory.answer!r} in {summary['steps']} steps, "
            f"{summary['tokens']} tokens; output in {summary['output_dir']}"
        )
    sys.exit(0 if trajectory.exit_status == "submitted" else 1)


# litellm's provider prefixes as the reference passes model names through it: the prefix picks the API (these
# are all OpenAI-compatible) and, with no --llm_base_url, the provider's endpoint; the server sees the rest.
PROVIDERS: dict[str, str | None] = {
    "openai": None,
    "hosted_vllm": None,
    "custom_openai": None,
    "text-completion-openai": None,
    "openrouter": "https://openrouter.ai/api/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "ollama": "http://localhost:11434/v1",
    "ollama_chat": "http://localhost:11434/v1",
    "lm_studio": "http://localhost:1234/v1",
    "groq": "https://api.groq.com/openai/v1",
    "together_ai": "https://api.together.xyz/v1",
    "fireworks_ai": "https://api.fireworks.ai/inference/v1",
    "mistral": "https://api.mistral.ai/v1",
    "xai": "https://api.x.ai/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta/openai",
}


def _model_route(name: str) -> tuple[str, str | None]:
    """(model as the server knows it, the provider's endpoint if the prefix names one). Only a known provider
    prefix goes, as in litellm: "openai/Qwen/Qwen3-8B" sends "Qwen/Qwen3-8B", "Qwen/Qwen3-8B" is sent whole."""
    provider, slash, rest = name.partition("/")
    if slash and rest and provider in PROVIDERS:
        return rest, PROVIDERS[provider]
    return name, None


def _extra_body(text: str) -> dict[str, Any]:
    """--extra_body as JSON, or as the Python literal the reference's README writes ({"thinking": True}); the
    strings "true" and "false" become booleans, as the reference makes them."""
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(
                f"--extra_body: not JSON ({text[:80]!r}); write an object, e.g. "
                '\'{"chat_template_kwargs": {"enable_thinking": false}}\''
            ) from None
    if not isinstance(value, dict):
        raise ValueError("--extra_body: expected a JSON object, e.g. '{\"top_p\": 0.95}'")
    return _booleans(value)


def _booleans(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _booleans(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_booleans(item) for item in value]
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _run_settings(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise click.UsageError(f"--settings {path}: not YAML ({exc}); e.g. 'llm_name: openai/gpt-4o'") from None
    if not isinstance(data, dict):
        raise click.UsageError(f"--settings {path}: expected a YAML mapping, e.g. 'llm_name: openai/gpt-4o'")
    return {key: str(value) for key, value in data.items() if value not in (None, "")}


def _docker_image(ref: str, quiet: bool) -> str:
    """The stored rootfs for image REF, pulled first if the store does not hold it (as Docker runs a local image
    without asking the registry); its store name."""
    from .sandbox.rootfs.pull import pull
    from .sandbox.rootfs.reference import Reference
    from .sandbox.rootfs.store import Store

    try:
        name = str(Reference.parse(ref))
        if Store().get(name) is not None:
            return name
        return pull(ref, name, progress=None if quiet else _progress(), log=None if quiet else click.echo).name
    except SandboxError as exc:
        raise click.UsageError(f"--docker_image {ref}: {exc} (e.g. --docker_image python:3.11-slim)") from None


@main.command("bench")
@click.argument("tasks_file", metavar="TASKS", type=click.Path(exists=True, dir_okay=False))
@click.option("--llm-name", "--llm_name", "--model", "llm_name", required=True, help="Model name at the endpoint.")
@click.option("--llm-base-url", "--llm_base_url", "llm_base_url", default=None, help="Default $OPENAI_BASE_URL.")
@click.option("--api-key", "--api_key", default=None, help="Default $OPENAI_API_KEY.")
@click.option(
    "--output-dir", "--output_dir", type=click.Path(file_okay=False), default="./bench-out", show_default=True
)
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--executor", type=click.Choice(["threads", "ray"]), default="threads", show_default=True)
@click.option("--ray-address", "--ray_address", default=None, help="Default $RAY_ADDRESS, else a local cluster.")
@click.option("--mode", type=click.Choice(["sandbox", "llm"]), default="sandbox", show_default=True)
@click.option("--resume", is_flag=True, help="Skip tasks already in OUTPUT_DIR/results.jsonl.")
@click.option("--max-steps", "--max_steps", type=int, default=100, show_default=True)
@click.option("--rootfs", default="host", show_default=True)
@click.option("--network", default="none", show_default=True, metavar="MODE", help=NETWORK_HELP)
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
def bench_cmd(
    tasks_file: str,
    llm_name: str,
    llm_base_url: str | None,
    api_key: str | None,
    output_dir: str,
    workers: int,
    executor: str,
    ray_address: str | None,
    mode: str,
    resume: bool,
    max_steps: int,
    rootfs: str,
    network: str,
    scorer_modules: tuple[str, ...],
    inputs_root: str | None,
    copy_out: tuple[str, ...],
) -> None:
    """Run every task of TASKS (JSONL) in its own sandbox, N at once, and score the answers.
    Ctrl-C once: running tasks finish, no new one starts; twice: they are killed. TASKS is data: its
    scorers are names (built-in, --scorer-module, or jailbox.scorers entry points) and its @path inputs
    lie beneath --inputs-root."""
    from .agent.batch import Batch, BatchConfig, find_executor
    from .agent.executors import ExecutorError
    from .agent.llm import LLMConfig
    from .agent.loop import AgentConfig
    from .agent.progress import Progress
    from .agent.report import write_summary
    from .agent.scoring import load_scorers
    from .agent.tasks import load_tasks, read_results

    try:
        tasks = load_tasks(tasks_file)
        fields: dict[str, Any] = {"model": llm_name}
        if llm_base_url:
            fields["base_url"] = llm_base_url
        if api_key:
            fields["api_key"] = api_key
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
            Path(output_dir),
            config,
            SandboxConfig(rootfs=rootfs, network=network),
            AgentConfig(max_steps=max_steps),
            executor=find_executor(executor),
            scorers=load_scorers(scorer_modules),
        )
    except (ValidationError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
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
            batch.run()
    except ExecutorError as exc:
        click.echo(f"jailbox: {exc}", err=True)
        sys.exit(2)
    finally:
        signal.signal(signal.SIGINT, previous)
    click.echo(write_summary(read_results(batch.results_path), Path(output_dir)))
    if batch.stopping.is_set():
        sys.exit(130)  # interrupted: the results file has what finished, --resume does the rest


@main.command()
@click.argument("trajectory", type=click.Path(exists=True, dir_okay=False))
@_jail_options
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Per-command timeout.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay(trajectory: str, timeout: float, as_json: bool, **jail: Any) -> None:
    """Re-run TRAJECTORY's actions (jailbox's or the reference package's) in a fresh sandbox and report,
    step by step, where the observation now differs. Exit 1 if any step differs."""
    from .agent.replay import replay as run_replay

    config = _config(**jail)
    try:
        steps = run_replay(trajectory, config, timeout=timeout)
    except SandboxError as exc:
        click.echo(f"jailbox: {exc}", err=True)
        sys.exit(125)
    if as_json:
        click.echo(json.dumps([s.model_dump() for s in steps]))
    else:
        for s in steps:
            click.echo(f"step {s.index:3} {s.verdict:8} {s.action[:90]}")
            if s.verdict == "differs":
                click.echo(_trim(s.diff, 1200))
        counts = {v: sum(s.verdict == v for s in steps) for v in ("same", "differs", "network")}
        click.echo(f"{counts['same']} same, {counts['differs']} differ, {counts['network']} used the network")
    sys.exit(1 if any(s.verdict == "differs" for s in steps) else 0)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """Check what this host allows (namespaces, overlayfs, id ranges, seccomp, cgroups) and print fixes."""
    from .sandbox.checks.doctor import run

    probes = run()
    if as_json:
        click.echo(json.dumps([p.model_dump() for p in probes], indent=2))
    else:
        width = max(len(p.name) for p in probes)
        for p in probes:
            click.echo(f"{p.status.upper():9} {p.name:{width}}  {p.detail}")
            if p.fix:
                click.echo(f"{'':9} {'':{width}}  fix: {p.fix}")
    sys.exit(1 if any(p.status == "failing" for p in probes) else 0)


@main.command()
@click.option("--force", is_flag=True, help="Also remove sandboxes whose host process still runs.")
def cleanup(force: bool) -> None:
    """Remove what crashed host processes left: jail processes, writable layers, state."""
    removed, failed = cleanup_state(state_dir(), force=force)
    for path in removed:
        click.echo(f"removed {path}")
    for path, why in failed:
        click.echo(f"could not remove {path}: {why}", err=True)
    click.echo(f"{len(removed)} removed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


@main.group("rootfs")
def rootfs_group() -> None:
    """Root filesystems: pull OCI images, import archives, list and remove them."""


def _rootfs_fail(exc: Exception) -> NoReturn:
    click.echo(f"jailbox: {exc}", err=True)
    sys.exit(1)


def _progress() -> Any:
    """A one-line progress display per blob on stderr (only on a terminal)."""
    if not sys.stderr.isatty():
        return None
    last = {"t": 0.0}

    def show(digest: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last["t"] < 0.1 and done != total:
            return
        last["t"] = now
        pct = f"{100 * done / total:5.1f}%" if total else ""
        click.echo(f"\r{digest[7:19]}  {done / 1e6:9.1f} MB {pct}", nl=done == total, err=True)

    return show


def _interrupt_once(signum: int, frame: object) -> None:
    """SIGINT handler for commands that clean up after Ctrl-C: the first one interrupts; more are
    ignored until the cleanup (bounded) is done, and so are its helpers', which inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


@rootfs_group.command("pull")
@click.argument("ref")
@click.option("--name", default=None, help="Store it under this name (default: the full reference).")
@click.option("--platform", default=None, help="os/arch[/variant] from a multi-platform image (default: this host).")
@click.option("--insecure", is_flag=True, help="Plain HTTP (always allowed for localhost registries).")
def rootfs_pull(ref: str, name: str | None, platform: str | None, insecure: bool) -> None:
    """Pull image REF (python:3.11-slim, ghcr.io/org/img@sha256:..., localhost:5000/x:y), no Docker."""
    from .sandbox.rootfs.pull import pull

    default_sigint = signal.signal(signal.SIGINT, _interrupt_once)
    try:
        entry = pull(ref, name, platform=platform, insecure=insecure, progress=_progress(), log=click.echo)
    except KeyboardInterrupt:
        click.echo("jailbox: interrupted; nothing stored (what was downloaded is kept: pull again to resume)", err=True)
        sys.exit(130)
    except SandboxError as exc:
        _rootfs_fail(exc)
    finally:
        signal.signal(signal.SIGINT, default_sigint)
    click.echo(f"{entry.name}  {entry.digest}  {entry.tree}")


@rootfs_group.command("build")
@click.argument("name", required=False)
@click.option(
    "--recipe",
    default=None,
    help="A recipe file, or a shipped recipe's name [default: NAME, which must then be one; no NAME: default].",
)
@click.option("--quiet", "-q", is_flag=True, help="Do not show mmdebstrap's progress.")
def rootfs_build(name: str | None, recipe: str | None, quiet: bool) -> None:
    """Build a root filesystem with mmdebstrap (rootless with subordinate ids, or as root).

    With no arguments it builds the paper's environment as "default"."""
    from .sandbox.rootfs import build, shipped

    if recipe is None:
        if name is not None and name not in shipped.names():
            _rootfs_fail(build.unknown_recipe(name))  # a typo must not build the 1.4 GB default
        recipe = name or "default"
    started = time.monotonic()
    default_sigint = signal.signal(signal.SIGINT, _interrupt_once)
    try:
        entry = build.build(name, recipe, log=None if quiet else lambda line: click.echo(line, err=True))
    except build.Interrupted as exc:
        done = f"stopped mmdebstrap, removed the unfinished tree {exc.removed}" if exc.removed else "nothing started"
        click.echo(f"jailbox: interrupted; {done}; nothing stored", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("jailbox: interrupted before the build started; nothing stored", err=True)
        sys.exit(130)
    except SandboxError as exc:
        _rootfs_fail(exc)
    finally:
        signal.signal(signal.SIGINT, default_sigint)
    took = time.monotonic() - started
    click.echo(f"{entry.name}  {entry.size / 1e6:.0f} MB in {took:.0f} s  {entry.tree}")


@rootfs_group.command("import")
@click.argument("source", type=click.Path(exists=True))
@click.argument("name")
@click.option("--platform", default=None, help="os/arch from a multi-platform OCI layout (default: this host).")
@click.option("--tag", default=None, help="Which image of an archive or layout holding several (its tag).")
def rootfs_import(source: str, name: str, platform: str | None, tag: str | None) -> None:
    """Import SOURCE (docker/podman save archive, OCI layout directory, rootfs tarball) as NAME."""
    from .sandbox.rootfs.importer import import_rootfs

    try:
        entry = import_rootfs(source, name, platform=platform, tag=tag)
    except SandboxError as exc:
        _rootfs_fail(exc)
    click.echo(f"{entry.name}  {entry.tree}")


@rootfs_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def rootfs_list(as_json: bool) -> None:
    """Stored root filesystems with kind, size, creation date and source."""
    from .sandbox.rootfs.store import Store

    entries = Store().list()
    if as_json:
        click.echo(json.dumps([{**e.model_dump(mode="json"), "path": str(e.tree)} for e in entries], indent=2))
        return
    for e in entries:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created))
        click.echo(f"{e.name:40} {e.kind:6} {e.size / 1e6:9.1f} MB  {created}  {e.source}")


@rootfs_group.command("rm")
@click.argument("names", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Remove even while live sandboxes use it.")
def rootfs_rm(names: tuple[str, ...], force: bool) -> None:
    """Remove stored root filesystems (their files may belong to subordinate ids)."""
    from .sandbox.rootfs.store import Store

    store = Store()
    for name in names:
        try:
            click.echo(f"removed {store.remove(name, force=force).name}")
        except SandboxError as exc:
            _rootfs_fail(exc)


@rootfs_group.command("path")
@click.argument("name")
def rootfs_path(name: str) -> None:
    """Print the directory of a stored root filesystem."""
    from .sandbox.rootfs.store import Store

    try:
        click.echo(str(Store().require(name).tree))
    except SandboxError as exc:
        _rootfs_fail(exc)


@rootfs_group.command("du")
@click.argument("name")
def rootfs_du(name: str) -> None:
    """Bytes used by a stored root filesystem (apparent and on disk; hard links once)."""
    from .sandbox.rootfs.store import Store

    try:
        usage = Store().du(name)
    except SandboxError as exc:
        _rootfs_fail(exc)
    click.echo(
        f"{usage['bytes'] / 1e6:.1f} MB apparent, {usage['disk'] / 1e6:.1f} MB on disk, {usage['entries']} entries"
    )


if __name__ == "__main__":
    main()
