"""Tokens: counting that matches the served model, for text and for images.

- :mod:`~longctx.tokens.tokenizers`: the tokenizers (the server's template,
  a tiktoken BPE file or a ``tokenizer.json`` from the model folder, the
  documented estimate) and per-file counts cached by content hash;
- :mod:`~longctx.tokens.images`: what an image costs in tokens (the
  server's count, or the processor's patch arithmetic as an estimate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# The package's names (its ``__all__``), each with the module it comes from, imported on first use
# (PEP 562) like the names of longctx itself.
_EXPORTS: dict[str, str] = {
    "ESTIMATE_BYTES_PER_TOKEN": "longctx.tokens.tokenizers",
    "KIMI_PAT_STR": "longctx.tokens.tokenizers",
    "EstimateTokenizer": "longctx.tokens.tokenizers",
    "TemplateTokenizer": "longctx.tokens.tokenizers",
    "TiktokenFileTokenizer": "longctx.tokens.tokenizers",
    "Tokenizer": "longctx.tokens.tokenizers",
    "TokenizerJsonTokenizer": "longctx.tokens.tokenizers",
    "cached_counts": "longctx.tokens.tokenizers",
    "offline_tokenizer": "longctx.tokens.tokenizers",
    "special_token_spellings": "longctx.tokens.tokenizers",
    "text_sha256": "longctx.tokens.tokenizers",
    "tokenizer_from_model_dir": "longctx.tokens.tokenizers",
    "ESTIMATED": "longctx.tokens.images",
    "SERVER_COUNTED": "longctx.tokens.images",
    "ImageTokenCounter": "longctx.tokens.images",
    "PatchImageCounter": "longctx.tokens.images",
    "estimate_image_counter": "longctx.tokens.images",
}

if TYPE_CHECKING:
    from longctx.tokens.images import ESTIMATED as ESTIMATED
    from longctx.tokens.images import SERVER_COUNTED as SERVER_COUNTED
    from longctx.tokens.images import ImageTokenCounter as ImageTokenCounter
    from longctx.tokens.images import PatchImageCounter as PatchImageCounter
    from longctx.tokens.images import estimate_image_counter as estimate_image_counter
    from longctx.tokens.tokenizers import ESTIMATE_BYTES_PER_TOKEN as ESTIMATE_BYTES_PER_TOKEN
    from longctx.tokens.tokenizers import KIMI_PAT_STR as KIMI_PAT_STR
    from longctx.tokens.tokenizers import EstimateTokenizer as EstimateTokenizer
    from longctx.tokens.tokenizers import TemplateTokenizer as TemplateTokenizer
    from longctx.tokens.tokenizers import TiktokenFileTokenizer as TiktokenFileTokenizer
    from longctx.tokens.tokenizers import Tokenizer as Tokenizer
    from longctx.tokens.tokenizers import TokenizerJsonTokenizer as TokenizerJsonTokenizer
    from longctx.tokens.tokenizers import cached_counts as cached_counts
    from longctx.tokens.tokenizers import offline_tokenizer as offline_tokenizer
    from longctx.tokens.tokenizers import special_token_spellings as special_token_spellings
    from longctx.tokens.tokenizers import text_sha256 as text_sha256
    from longctx.tokens.tokenizers import tokenizer_from_model_dir as tokenizer_from_model_dir


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
