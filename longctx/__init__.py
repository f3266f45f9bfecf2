"""longctx: cache-friendly long-context question answering on vLLM and SGLang."""

from __future__ import annotations

from longctx.errors import LongctxError

__all__ = ["LongctxError", "__version__"]

__version__ = "0.1.0"
