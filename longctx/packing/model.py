"""The pack's data: sections, the pack itself, its budget and shards, and what comparing packs tells.

A :class:`Pack` is the shared start of every request about a corpus: a
fixed system message and the start of the first user message (documents,
listing, boundary); the question comes right after it. It is a pure
function of the documents and the manifest (see :mod:`longctx.packing.rendering`
and ``docs/pack-format.md``), fingerprinted per section so that a cache
break can be located (:func:`~longctx.packing.compare.compare_packs`).

This module holds values only: building them is :mod:`longctx.packing.build`
and :mod:`longctx.packing.budget`'s work, reading them back from the store
:mod:`longctx.packing.snapshots`'s; it imports none of those, so each of them
can import it. :class:`Budget` is here and not with the budget check
because a :class:`ShardedPack` holds one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import field
from functools import cached_property
from typing import Any, BinaryIO, Final

from longctx import outputs
from longctx.errors import ConfigError
from longctx.options.groups import DEFAULT_RESERVED_QUESTION_TOKENS
from longctx.outputs import Saved
from longctx.packing.image_parts import PlacedImage, content_parts
from longctx.packing.rendering import FORMAT_VERSION
from longctx.recordtypes import record_type
from longctx.sources.corpus import Manifest
from longctx.store import StoredText
from longctx.tokens.tokenizers import Tokenizer, text_sha256

__all__ = [
    "DOCUMENT_PREFIX",
    "EARLIER_PREFIX",
    "BoundaryCheck",
    "Budget",
    "ManifestSummary",
    "Pack",
    "PackComparison",
    "PackResult",
    "PromptCount",
    "Section",
    "ShardedPack",
    "pack_digest_start",
    "pack_fingerprint",
    "section_fingerprint",
]

DOCUMENT_PREFIX: Final = "document:"
"""How a document section's name starts: ``document:`` then the document's path."""
EARLIER_PREFIX: Final = "earlier:"
"""How the name of an earlier copy of a changed file starts (a layered pack): ``earlier:`` then its path."""


class _Text:
    """The descriptor behind :attr:`Section.text`: a str, or UTF-8 decoded on first read.

    A pack read back from the store (:mod:`longctx.packing.snapshots`) holds its
    sections as views of the stored UTF-8: writing it out or comparing
    fingerprints never decodes 37 MB nobody reads.
    """

    def __get__(self, section: object, owner: type | None = None) -> str:
        if section is None:
            raise AttributeError("text")  # no default value, for dataclasses
        value = section.__dict__["text"]
        if isinstance(value, str):
            return value
        text = str(value, "utf-8", "surrogatepass")
        section.__dict__["text"] = text
        return text

    def __set__(self, section: object, value: str | memoryview) -> None:
        section.__dict__["text"] = value


@record_type
class Section:
    """One fingerprinted piece of the prompt prefix.

    ``name`` is ``header`` (the system message), ``opening``,
    ``document:<path>``, ``listing`` or ``boundary``; a layered pack
    (:mod:`longctx.sources.history`) also has ``earlier:<path>`` (the base's
    copy of a file changed since) and ``changes`` (the marker before the
    documents changed since the base). ``fingerprint`` is the
    sha256 of ``text``'s UTF-8 bytes; ``tokens`` its count under the pack's
    tokenizer, when counted. ``text`` may be given as a view of its UTF-8
    (a section read back from the store); it is decoded when first read.
    """

    name: str
    text: _Text = _Text()
    # The descriptor above gives text no default (its class access raises
    # AttributeError), which dataclasses honour and mypy does not see.
    fingerprint: str  # type: ignore[misc]
    tokens: int | None = None

    def utf8(self) -> bytes | memoryview:
        """``text`` as UTF-8, without decoding a section given as UTF-8."""
        value = self.__dict__["text"]
        return value if isinstance(value, memoryview) else value.encode("utf-8", "surrogatepass")

    @property
    def path(self) -> str | None:
        """The document path of a ``document:`` section, else None."""
        return self.name[len(DOCUMENT_PREFIX) :] if self.name.startswith(DOCUMENT_PREFIX) else None

    @property
    def size_bytes(self) -> int:
        value = self.__dict__["text"]
        return value.nbytes if isinstance(value, memoryview) else len(value.encode("utf-8", "surrogatepass"))


@record_type
class PromptCount:
    """The tokens of one first request: pack prefix, chat template, question.

    ``total`` is None when a part is unknown (no template measure without the
    server tokenizer); ``estimated`` when any part is an estimate.
    """

    prefix_tokens: int | None
    template_overhead_tokens: int | None
    question_tokens: int | None
    estimated: bool

    @property
    def total(self) -> int | None:
        parts = (self.prefix_tokens, self.template_overhead_tokens, self.question_tokens)
        return (
            None if any(part is None for part in parts) else sum(part for part in parts if part is not None)
        )


@record_type
class Pack:
    """The shared prompt prefix of a corpus (or of one shard of it).

    ``system`` is the system message (the ``header`` section); ``prefix`` is
    the start of the first user message, the concatenation of every other
    section, ending with the boundary (``Question:`` and a line break); the
    question is appended right after it. ``fingerprint`` covers the format
    version, ``system`` and ``prefix``. ``prefix_tokens`` counts ``system``
    plus ``prefix`` as the server tokenizes them, without the chat
    template's own tokens, which are ``template_overhead_tokens`` (known
    with the server tokenizer only). ``part`` is the 1-based shard number
    when the pack is one of several.

    ``images`` are the pack's images, each at its placeholder line in
    ``prefix`` (see :mod:`longctx.sources.images`); a pack with images has
    format ``longctx-pack/5`` and its own system message, and sends its
    first user message as content parts (:meth:`user_parts`).
    ``image_tokens`` is what the images cost the model (an
    :class:`~longctx.tokens.images.ImageTokenCounter`'s count, None when not
    counted); ``image_counter`` names that counter. ``prefix_tokens`` counts
    the text form, placeholder lines included (a few dozen tokens an image
    more than the request sends: the budget errs on the safe side).
    """

    format_version: str
    system: str
    sections: tuple[Section, ...]
    fingerprint: str
    tokenizer: str | None
    estimated: bool
    prefix_tokens: int | None
    template_overhead_tokens: int | None
    part: int | None = None
    sections_additive: bool | None = field(default=None)
    images: tuple[PlacedImage, ...] = ()
    image_tokens: int | None = None
    image_counter: str | None = None
    # The UTF-8 of every section in order, when the pack was read back from
    # the store: write_to hands it over in one piece.
    _stored_text: StoredText | None = field(default=None, compare=False, repr=False)

    @cached_property
    def prefix(self) -> str:
        """The start of the first user message: every section after the header, joined.

        Joined on first use and kept: a large pack's text is held once per
        section until someone needs it whole (see :meth:`prefix_parts`).
        """
        return "".join(self.prefix_parts())

    def prefix_parts(self) -> Iterator[str]:
        """The prefix's sections' texts in order, to write or send a pack without joining it."""
        return (section.text for section in self.sections[1:])

    def write_to(self, stream: BinaryIO) -> int:
        """Write ``system`` then ``prefix`` to ``stream`` as UTF-8, section by section; return the byte count.

        The fastest way to save a pack: nothing is joined, and a pack read
        back from the store is written from the stored bytes as they are.
        """
        if self._stored_text is not None:
            return self._stored_text.copy_to(stream)
        written = 0
        for section in self.sections:
            data = section.utf8()
            stream.write(data)
            written += len(data) if isinstance(data, bytes) else data.nbytes
        return written

    def save(self, path: str | os.PathLike[str]) -> Saved:
        """Save the pack's bytes (what :meth:`write_to` writes) to the file ``path``, whole or not at all.

        A file that already holds exactly these bytes is left as it is
        (``Saved.unchanged``); see :mod:`longctx.outputs` for the rest of
        the contract. Raises :class:`~longctx.errors.OutputError`.
        """
        stored = self._stored_text
        if stored is not None:
            return outputs.save(
                path, stored.size, lambda: stored.read_chunks(outputs.COMPARE_BYTES), self.write_to
            )
        # Encoded once, for the size, the comparison and the write alike.
        parts = [section.utf8() for section in self.sections]

        def write(stream: BinaryIO) -> int:
            for part in parts:
                stream.write(part)
            return sum(len(part) for part in parts)

        return outputs.save(path, sum(len(part) for part in parts), lambda: parts, write)

    @property
    def size_bytes(self) -> int:
        """The byte count :meth:`write_to` writes: every section's UTF-8."""
        if self._stored_text is not None:
            return self._stored_text.size
        return sum(section.size_bytes for section in self.sections)

    def user_content(self, question: str) -> str:
        """The first user message for ``question``: the prefix, then the question unchanged."""
        return self.prefix + question

    def user_parts(self, question: str) -> list[dict[str, Any]]:
        """The first user message for ``question`` as OpenAI content parts, each image in its place."""
        return content_parts(self.prefix, self.images, question)

    def messages(self, question: str) -> list[dict[str, Any]]:
        """The chat messages of a first request: the system message, then the prefix and the question.

        The user message's content is one string, or content parts
        (:meth:`user_parts`) when the pack holds images.
        """
        content: str | list[dict[str, Any]] = (
            self.user_parts(question) if self.images else self.user_content(question)
        )
        return [{"role": "system", "content": self.system}, {"role": "user", "content": content}]

    @property
    def documents(self) -> tuple[Section, ...]:
        """The document sections, in pack order."""
        # The name's prefix, not Section.path: a reused pack's summary line asks this of 5,000 sections.
        return tuple(section for section in self.sections if section.name.startswith(DOCUMENT_PREFIX))

    @property
    def earlier_copies(self) -> tuple[Section, ...]:
        """The ``earlier:`` sections of a layered pack: the base's copies of files changed since."""
        return tuple(section for section in self.sections if section.name.startswith(EARLIER_PREFIX))

    def section(self, name: str) -> Section:
        """The section called ``name``; raises KeyError when there is none."""
        for section in self.sections:
            if section.name == name:
                return section
        raise KeyError(name)

    @property
    def total_tokens(self) -> int | None:
        """Prefix plus template tokens: what the pack takes of the window before any question."""
        if self.prefix_tokens is None:
            return None
        return self.prefix_tokens + (self.template_overhead_tokens or 0) + (self.image_tokens or 0)

    def prompt_count(self, question: str, tokenizer: Tokenizer) -> PromptCount:
        """Count the first request for ``question``: this pack's counts plus the question's tokens.

        ``tokenizer`` should be the one the pack was counted with; the
        question is counted alone (the boundary keeps it from merging with
        the prefix, see :func:`~longctx.packing.compare.check_cache_boundary`).
        """
        return PromptCount(
            prefix_tokens=self.prefix_tokens,
            template_overhead_tokens=self.template_overhead_tokens,
            question_tokens=tokenizer.count(question),
            estimated=self.estimated or tokenizer.estimated,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able facts: version, fingerprints, counts (flagged when estimated), sections.

        A pack with images adds ``images`` (each image's digest, size and
        what it is), ``image_tokens`` and ``image_counter``; one without
        keeps the keys it always had.
        """
        facts = self._facts()
        if self.images:
            facts["image_tokens"] = self.image_tokens
            facts["image_counter"] = self.image_counter
            facts["images"] = [
                {
                    "sha256": placed.image.sha256,
                    "media_type": placed.image.media_type,
                    "width": placed.image.width,
                    "height": placed.image.height,
                    "source": placed.image.source,
                    "reason": placed.image.reason,
                }
                for placed in self.images
            ]
        return facts

    def _facts(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "fingerprint": self.fingerprint,
            "part": self.part,
            "tokenizer": self.tokenizer,
            "estimated": self.estimated,
            "prefix_tokens": self.prefix_tokens,
            "template_overhead_tokens": self.template_overhead_tokens,
            "total_tokens": self.total_tokens,
            "sections_additive": self.sections_additive,
            "system_bytes": len(self.system.encode("utf-8")),
            "prefix_bytes": len(self.prefix.encode("utf-8")),
            "document_count": len(self.documents),
            "earlier_copy_count": len(self.earlier_copies),
            "sections": [
                {"name": section.name, "fingerprint": section.fingerprint, "tokens": section.tokens}
                for section in self.sections
            ],
        }


@record_type
class Budget:
    """How many tokens a pack may take: the context length less what the answer and question need.

    ``prompt_budget`` = ``context_length`` - ``reserved_output_tokens`` -
    ``reserved_question_tokens``; a pack fits when its prefix plus the chat
    template's tokens are at most that.
    """

    context_length: int
    reserved_output_tokens: int = 4096
    reserved_question_tokens: int = DEFAULT_RESERVED_QUESTION_TOKENS

    def __post_init__(self) -> None:
        for name in ("context_length", "reserved_output_tokens", "reserved_question_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"Budget.{name} must be a non-negative integer, not {value!r}")
        if self.prompt_budget <= 0:
            raise ConfigError(
                f"the budget leaves no room for a pack: context {self.context_length} - output "
                f"{self.reserved_output_tokens} - question {self.reserved_question_tokens} <= 0"
            )

    @property
    def prompt_budget(self) -> int:
        return self.context_length - self.reserved_output_tokens - self.reserved_question_tokens

    def describe(self) -> str:
        return (
            f"{self.prompt_budget:,} (context {self.context_length:,}"
            f" - output {self.reserved_output_tokens:,}"
            f" - question {self.reserved_question_tokens:,})"
        )


@record_type
class ShardedPack:
    """A corpus split into packs that each fit the budget, in corpus order.

    Each shard is a full :class:`Pack` (same header, its own documents, its
    own listing, ``part`` 1, 2, ...); the listing of skipped paths is in the
    last one. ``fingerprint`` covers the shards' fingerprints in order.
    """

    shards: tuple[Pack, ...]
    budget: Budget
    fingerprint: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "prompt_budget": self.budget.prompt_budget,
            "shards": [shard.to_dict() for shard in self.shards],
        }


@record_type
class ManifestSummary:
    """What a pack's summary line says of its manifest: the paths skipped per reason, the lossy files.

    ``lossy_paths`` are the included files whose invalid UTF-8 was replaced
    by U+FFFD. A pack read back from the store keeps this beside its
    manifest, so the line of an unchanged re-pack decodes none of the
    manifest's thousands of entries.
    """

    skipped_by_reason: dict[str, int]
    lossy_paths: tuple[str, ...]

    @classmethod
    def of(cls, manifest: Manifest) -> ManifestSummary:
        """The summary of ``manifest``."""
        lossy = tuple(entry.path for entry in manifest.included if entry.lossy)
        return cls(manifest.skipped_by_reason(), lossy)


@record_type
class PackResult:
    """What :func:`~longctx.packing.pack` returns: the pack, the manifest of the paths considered, its origin.

    ``ordering`` is the policy the documents were put in. ``reused`` is True
    when the pack and manifest were read back from the store (the
    repository had not changed since they were built) rather than built
    from the files; either way they are what :func:`~longctx.packing.build.build_pack` and
    :func:`~longctx.sources.corpus.load_corpus` give for the same inputs. ``layer_note``
    says why a repository's pack is layered on its base, or why it starts
    over from a nearer one (see :class:`~longctx.sources.history.LayerPlan`);
    None when there is nothing to say, and for a reused pack. ``reuse_note``
    says why a pack that was to be reused from the store was packed from
    the files instead (a pack with images keeps no snapshot); None otherwise.
    """

    pack: Pack
    # The manifest, or for a reused pack the call that decodes it: most
    # callers of a reused pack never read its thousands of entries.
    _manifest: Manifest | Callable[[], Manifest] = field(repr=False, compare=False)
    ordering: str
    reused: bool
    layer_note: str | None = None
    # For a reused pack, what the summary line needs of the manifest, stored
    # with it; None: worked out from the manifest.
    _manifest_summary: ManifestSummary | None = field(default=None, repr=False, compare=False)
    reuse_note: str | None = None

    @cached_property
    def manifest(self) -> Manifest:
        """Every path considered, with what became of it (see :class:`~longctx.sources.corpus.Manifest`)."""
        return self._manifest if isinstance(self._manifest, Manifest) else self._manifest()

    def to_dict(self) -> dict[str, Any]:
        """The pack's summary, the manifest and whether it was reused (``longctx pack --json``)."""
        return {
            "pack": self.pack.to_dict(),
            "manifest": self.manifest.to_dict(),
            "reused": self.reused,
            "layers": self.layer_note,
            **({"reuse_note": self.reuse_note} if self.reuse_note else {}),
        }

    def summary_line(self) -> str:
        """One line for a terminal: documents, earlier copies, tokens, what was skipped, the fingerprint."""
        built = self.pack
        summary = self._manifest_summary or ManifestSummary.of(self.manifest)
        skipped = summary.skipped_by_reason
        skipped_text = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items())) or "none"
        tokens = built.prefix_tokens
        count_text = (
            "not counted"
            if tokens is None
            else f"{tokens:,} tokens{' (estimated)' if built.estimated else ''}"
        )
        earlier = built.earlier_copies
        earlier_text = ""
        if earlier:
            earlier_tokens = sum(section.tokens or 0 for section in earlier)
            copies = "copy" if len(earlier) == 1 else "copies"
            earlier_text = f" (and {len(earlier)} earlier {copies} of changed files" + (
                f", {earlier_tokens:,} tokens)" if tokens is not None else ")"
            )
        return (
            f"packed {len(built.documents)} document{'' if len(built.documents) == 1 else 's'}{earlier_text}"
            f"{' (unchanged: reused)' if self.reused else ''}: "
            f"{count_text}; skipped: {skipped_text}; fingerprint {built.fingerprint[:16]}"
            + self._images_text()
            + (f"; {self.layer_note}" if self.layer_note else "")
            + (f"; {self.reuse_note}" if self.reuse_note else "")
            + self._lossy_text(summary.lossy_paths)
        )

    def _images_text(self) -> str:
        # Said on the line: the images' tokens are part of what the pack costs, and how sure that is.
        built = self.pack
        if not built.images:
            return ""
        count = len(built.images)
        tokens = "not counted" if built.image_tokens is None else f"{built.image_tokens:,} tokens"
        return f"; {count} image{'' if count == 1 else 's'}: {tokens}" + (
            f", {built.image_counter}" if built.image_counter else ""
        )

    @staticmethod
    def _lossy_text(lossy: tuple[str, ...]) -> str:
        # Said on the line, not only in the JSON manifest: invalid UTF-8 became U+FFFD in the pack.
        if not lossy:
            return ""
        shown = ", ".join(lossy[:3]) + (f" and {len(lossy) - 3} more" if len(lossy) > 3 else "")
        files = "file was" if len(lossy) == 1 else "files were"
        return f"; {len(lossy)} {files} not valid UTF-8, decoded with U+FFFD replacements: {shown}"


@record_type
class PackComparison:
    """Where two packs part, and how much of the old prefix a server cache can still reuse.

    ``first_difference`` is the name of the first section that differs (the
    new pack's, or the old one's when the new pack ended first), None when
    the packs are identical. ``surviving_bytes`` counts the UTF-8 bytes of
    ``system + prefix`` shared from the start (whole sections, plus the
    common start of the first differing one); ``surviving_tokens`` the
    tokens of the whole sections shared from the start, when both packs were
    counted by the same tokenizer (a lower bound on the reusable tokens).
    ``partial_tokens`` adds the tokens of the first differing section's
    shared start, up to its last shared line break, when
    :func:`~longctx.packing.compare.compare_packs` was given the tokenizer.
    """

    identical: bool
    first_difference: str | None
    detail: str
    surviving_sections: int
    surviving_bytes: int
    surviving_tokens: int | None
    old_prefix_tokens: int | None
    partial_tokens: int | None = None

    @property
    def surviving_share(self) -> float | None:
        """Surviving tokens (whole sections and ``partial_tokens``) per old pack token (1.0: identical)."""
        if self.surviving_tokens is None or not self.old_prefix_tokens:
            return None
        return (self.surviving_tokens + (self.partial_tokens or 0)) / self.old_prefix_tokens


@record_type
class BoundaryCheck:
    """Whether the prefix's tokens are a prefix of the tokens of prefix + question.

    ``divergent_position`` is the index of the first token where they
    differ (None when ``ok``).
    """

    ok: bool
    prefix_tokens: int
    prompt_tokens: int
    divergent_position: int | None
    question: str


# -- fingerprints -------------------------------------------------------------


def section_fingerprint(text: str) -> str:
    """A section's fingerprint: the sha256 of its text (the key its token count is cached under)."""
    return text_sha256(text)


def pack_digest_start(system: str, version: str = FORMAT_VERSION) -> hashlib._Hash:
    """A sha256 fed with the format ``version`` and the system message, each followed by a NUL byte."""
    digest = hashlib.sha256()
    for part in (version, system):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest


def pack_fingerprint(system: str, prefix_parts: Iterable[str], version: str = FORMAT_VERSION) -> str:
    """sha256 of the format version, the system message and the prefix, each followed by a NUL byte."""
    digest = pack_digest_start(system, version)
    for part in prefix_parts:
        digest.update(part.encode("utf-8"))
    digest.update(b"\0")
    return digest.hexdigest()
