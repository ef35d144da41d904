"""What the kernel counts per host uid, filled from a jail and tried from elsewhere (test helpers).

The scripts run in a jail (or on the host) with ``python3 -c``; ``started`` runs one in a jail's
background and returns the counts it printed once it stopped filling (it then holds what it took).
"""

from __future__ import annotations

from jailbox.sandbox import Sandbox

# Epoll watches: one pipe's read end under 1,000 descriptors, each registered in instance after
# instance until the kernel refuses (ENOSPC: the uid holds max_user_watches).
WATCHES = """
import os, select, time
r, w = os.pipe()
fds = [os.dup(r) for _ in range(1000)]
instances, watches, refused = [], 0, 0
while not refused:
    ep = select.epoll()
    instances.append(ep)
    for fd in fds:
        try:
            ep.register(fd, select.EPOLLIN)
        except OSError as exc:
            refused = exc.errno
            break
        watches += 1
print(watches, refused, flush=True)
time.sleep(600)
"""

WATCH_ONE = """
import os, select
r, w = os.pipe()
select.epoll().register(r, select.EPOLLIN)
print("watched")
"""


def started(sb: Sandbox, script: str) -> list[int]:
    """Run ``script`` in the background of ``sb`` and return what it printed first (its counts)."""
    sb.write_file("/tmp/fill.py", script)
    sb.exec("python3 /tmp/fill.py > /tmp/fill.out 2>&1 &")
    out = sb.exec("for i in $(seq 1200); do [ -s /tmp/fill.out ] && break; sleep 0.1; done; cat /tmp/fill.out")
    return [int(word) for word in out.stdout.split()]
