"""The E2B server's own error (runs in the server process): one a control-plane request answers with."""

from __future__ import annotations

from ...sandbox.errors import ServerError


class ServeError(ServerError):
    """A control-plane request that cannot be met: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
