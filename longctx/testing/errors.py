"""The errors of the test harness: building and running the local test servers.

They are the harness's, not the product's: a user of longctx never meets
them outside :mod:`longctx.testing`. They derive from
:class:`~longctx.errors.LongctxError`, so a test that catches every
longctx error catches these too.

    LongctxError
    └── HarnessError               the local test servers failed
        ├── EnvironmentBuildError  a server's virtual environment failed to build
        ├── ModelBuildError        the tiny model failed to build
        ├── ServerStartError       a server did not become ready
        └── ServerDiedError        a server exited while in use
"""

from __future__ import annotations

from longctx.errors import LongctxError

__all__ = [
    "EnvironmentBuildError",
    "HarnessError",
    "ModelBuildError",
    "ServerDiedError",
    "ServerStartError",
]


class HarnessError(LongctxError):
    """The local test servers of :mod:`longctx.testing` failed."""


class EnvironmentBuildError(HarnessError):
    """A server's virtual environment could not be built; ``log_tail`` says why."""

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


class ModelBuildError(HarnessError):
    """The tiny test model could not be built; ``log_tail`` says why."""

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


class ServerStartError(HarnessError):
    """A server did not become ready; ``log_tail`` holds the end of its log."""

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- server log tail ---\n{log_tail}")
        self.log_tail = log_tail


class ServerDiedError(HarnessError):
    """A server exited while a test was using it; ``log_tail`` says why."""

    def __init__(self, message: str, *, returncode: int | None, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- server log tail ---\n{log_tail}")
        self.returncode = returncode
        self.log_tail = log_tail
