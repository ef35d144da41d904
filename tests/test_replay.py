"""jailbox replay: recorded actions re-run in a fresh jail, observation by observation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jailbox.agent.replay import normalise, replay
from jailbox.sandbox import Mount, SandboxConfig

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "data" / "reference-trajectories"


@pytest.fixture
def with_python(tmp_path) -> SandboxConfig:
    """The host rootfs plus the `python` command the paper's image has (recorded runs call it)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python").symlink_to("/usr/bin/python3")
    return SandboxConfig(mounts=[Mount(shim, "/opt/shim")], env={"PATH": "/opt/shim:/usr/local/bin:/usr/bin:/bin"})


@pytest.mark.needs("shared-data")
def test_reference_math_trajectory_reproduces_step_by_step(with_python):
    path = REFERENCE / "trajectory_math.json"
    assert path.exists(), f"{path} is missing (../shared/data beside the checkout)"
    steps = replay(path, with_python)
    for step in steps:
        print(f"step {step.index}: {step.verdict:8} {step.action[:70]}")
    assert len(steps) == 8
    assert [s.verdict for s in steps] == ["same"] * 8


@pytest.mark.needs("shared-data")
def test_a_changed_observation_is_reported_with_a_diff(tmp_path, with_python):
    data = json.loads((REFERENCE / "trajectory_math.json").read_text())
    data["steps"][1]["observation"] = data["steps"][1]["observation"].replace("588.0", "589.0")
    data["steps"].insert(
        2,
        {
            "thought": "",
            "reasoning_content": "",
            "observation": "Successfully installed x",
            "action": "{'function': 'execute_bash', 'parameters': {'command': 'pip install nothing'}}",
        },
    )
    tampered = tmp_path / "t.json"
    tampered.write_text(json.dumps(data))
    steps = replay(tampered, with_python)
    assert steps[1].verdict == "differs" and "-Area of heptagon: 589.0" in steps[1].diff
    assert "+Area of heptagon: 588.0" in steps[1].diff
    assert steps[2].verdict == "network"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from jailbox.cli import main; main()",
            "replay",
            str(tampered),
            "--bind",
            f"{tmp_path / 'shim'}:/opt/shim",
            "--env",
            "PATH=/opt/shim:/usr/bin:/bin",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and "7 same, 1 differ, 1 used the network" in r.stdout


def test_normalise_ignores_the_wrappers_of_each_format():
    reference = "Exit code: 0\nExecution output of \\[execute_bash]:\n\\[STDOUT]\n42\n"
    ours = "Exit code: 0\n[STDOUT]\n42\n[STDERR]\n(empty)\n\nSteps Remaining: 3"
    assert normalise(reference) == normalise(ours) == ["42"]
    assert normalise("(no output)") == normalise("Exit code: 0\n[STDOUT]\n(empty)\n[STDERR]\n(empty)\n") == []
