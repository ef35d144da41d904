"""Bounded capture of one output stream: keeps the head and the tail, counts what it dropped.

A command printing gigabytes costs the host at most ``limit`` bytes; the dropped middle is
reported, not silently lost.
"""

from __future__ import annotations

from collections import deque


class Capture:
    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail.append(data)
        self.tail_size += len(data)
        while self.tail and self.tail_size - len(self.tail[0]) >= self.tail_limit:
            self.tail_size -= len(self.tail.popleft())

    def result(self) -> tuple[bytes, int]:
        """(kept bytes, number of bytes dropped from the middle)."""
        tail = b"".join(self.tail)
        if len(tail) > self.tail_limit:
            tail = tail[len(tail) - self.tail_limit :]
        kept = bytes(self.head) + tail
        return kept, self.total - len(kept)
