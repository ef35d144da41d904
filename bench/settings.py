"""How many repetitions each case gets: the full run and the CI smoke run."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Settings:
    one_shot_reps: int = 50
    create_reps: int = 50
    exec_reps: int = 500
    throughput_sandboxes: int = 64
    throughput_seconds: float = 2.0
    throughput_rounds: int = 5
    density: int = 512
    burst_size: int = 100
    burst_rounds: int = 5
    network_reps: int = 30
    cli_reps: int = 30
    container_reps: int = 20
    warmup: int = 3
    agent_steps: int = 200
    serve_reps: int = 100
    serve_idle: int = 64
    epoll_reps: int = 1000
    epoll_rounds: int = 6
    pause_reps: int = 200
    branch_files: int = 10_000  # files in the layer a checkpoint copies (64 MiB at 10,000)
    branch_reps: int = 5
    fork_children: int = 16
    fork_many: int = 100  # children of the larger fork
    snapshot_starts: int = 100  # sandboxes started from one snapshot at once
    secret_reps: int = 200  # HTTPS requests with and without a secret added at the proxy
    code_reps: int = 300  # run_code("1+1") on a warm context
    view_reps: int = 30  # the viewer's page of a 1,000-task batch
    code_starts: int = 5  # sandboxes created to their first run_code result (a kernel start each)
    code_warm_starts: int = 30  # the same from a pool whose kernels started ahead (a refill waited for each)
    rollouts: int = 64  # fresh jail + `true`, through Ray and locally
    rollout_workers: int = 4  # rollouts at once (Ray actors, local threads)
    image: str = "docker.io/library/busybox:latest"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


FULL = Settings()
QUICK = Settings(
    one_shot_reps=5,
    create_reps=5,
    exec_reps=50,
    throughput_sandboxes=8,
    throughput_seconds=0.2,
    throughput_rounds=2,
    density=16,
    burst_size=10,
    burst_rounds=2,
    network_reps=5,
    cli_reps=3,
    container_reps=3,
    warmup=1,
    agent_steps=10,
    serve_reps=5,
    branch_files=200,
    branch_reps=2,
    fork_children=2,
    fork_many=3,
    snapshot_starts=4,
    secret_reps=10,
    serve_idle=8,
    epoll_reps=50,
    epoll_rounds=2,
    pause_reps=10,
    code_reps=20,
    view_reps=3,
    code_starts=1,
    code_warm_starts=3,
    rollouts=4,
    rollout_workers=2,
)
