"""A program that meets each of the library's bounds and says what it got, for the tests of the flags that set
them (``test_cli_bounds.py``, ``test_service.py``): ``BOUNDS`` as a Docker user types them, and ``held``,
which reads the program's output."""

from __future__ import annotations

import base64
import re

# One program that meets every bound and prints a line per bound of what it got: the exit status of a
# 256 MiB allocation (-9: the kernel killed it), how many of 64 children it could fork, CPU seconds per
# wall second spinning for one second, whether 16 MiB fit in /tmp (the jail's tmpfs, sized by --disk and
# counted in inodes by --inodes), and how many of 1,000 empty files did.
PROBE = """
import os, signal, subprocess, time
hog = subprocess.run(["python3", "-c", "bytearray(256 << 20)"], capture_output=True)
print("memory", hog.returncode)
children = []
try:
    for _ in range(64):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError:
    pass
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print("pids", len(children))
wall, cpu = time.monotonic(), time.process_time()
while time.monotonic() - wall < 1:
    pass
print("cpus", round((time.process_time() - cpu) / (time.monotonic() - wall), 2))
try:
    with open("/tmp/fill", "wb") as f:
        f.write(bytes(16 << 20))
    print("disk", "room")
except OSError as exc:
    print("disk", exc.strerror)
os.remove("/tmp/fill")
made = 0
try:
    while made < 1000:
        open(f"/tmp/f{made}", "w").close()
        made += 1
except OSError:
    pass
print("inodes", made)
"""
# The probe as one shell line: no quoting to get through a pty, a model's tool call or a tasks file.
PROBE_LINE = f"echo {base64.b64encode(PROBE.encode()).decode()} | base64 -d | python3 -"
BOUNDS = ["-m", "64m", "--cpus", "0.1", "--pids-limit", "16", "--disk", "8m", "--inodes", "200"]


def held(output: str) -> None:
    """The probe's output shows every bound of ``BOUNDS`` held."""
    got = dict(re.findall(r"^(memory|pids|cpus|disk|inodes) (.+)$", output, re.M))
    assert set(got) == {"memory", "pids", "cpus", "disk", "inodes"}, output[-2000:]
    assert int(got["memory"]) == -9, got  # killed by the kernel at 64 MiB
    assert 0 < int(got["pids"]) < 16, got
    assert float(got["cpus"]) <= 0.1 * 1.5 + 0.05, got  # the quota, with test_limits.py's allowance
    assert got["disk"] == "No space left on device", got  # /tmp holds 8 MiB
    assert 0 < int(got["inodes"]) < 200, got
