"""Reading the end of a build or server log for error messages."""

from __future__ import annotations

from collections import deque
from pathlib import Path

# pip on machines with a local wheel mirror prints one such line per package;
# they would push the real error out of a tail.
_NOISE = ("is ignored: it is neither a file nor a directory",)


def log_tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` meaningful lines of ``path``, or a note if it cannot be read."""
    try:
        with path.open(errors="replace") as handle:
            kept: deque[str] = deque(
                (line.rstrip("\n") for line in handle if not any(noise in line for noise in _NOISE)),
                maxlen=lines,
            )
    except OSError as error:
        return f"(log {path} unreadable: {error.strerror})"
    return "\n".join(kept) if kept else f"(log {path} is empty)"
