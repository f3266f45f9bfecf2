"""The budget check, and the shards of a corpus too large for one pack.

:func:`~longctx.packing.build.build_pack` and :func:`~longctx.packing.build.pack`
raise :class:`~longctx.errors.BudgetError` (total, budget, largest files and
folders) through :func:`check_budget` when a pack does not fit its
:class:`~longctx.packing.model.Budget`; :func:`build_shards` splits the
documents, in corpus order, into packs that each fit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

from longctx.documents import Document
from longctx.errors import BudgetError
from longctx.packing.assembly import (
    PackCounter,
    Sections,
    assemble,
    document_section_texts,
    included_notes,
    is_listed,
    skipped_entries,
)
from longctx.packing.counting import count_texts
from longctx.packing.model import DOCUMENT_PREFIX, Budget, Pack, ShardedPack, section_fingerprint
from longctx.packing.rendering import ListingEntry, folder_lines, render_listing
from longctx.recordtypes import record_type
from longctx.sources.corpus import Corpus
from longctx.store import Store
from longctx.tokens.images import ImageTokenCounter
from longctx.tokens.tokenizers import EstimateTokenizer, Tokenizer, cached_counts

__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "LowerBound",
    "build_shards",
    "character_sizes",
    "check_budget",
    "check_lower_bound",
    "refusal_advice",
]

_LARGEST_SHOWN: Final = 10

MAX_CHARS_PER_TOKEN: Final = 1024
"""Most characters one token can hold, for the lower bound :func:`check_lower_bound` proves.

A token of a byte-level BPE vocabulary holds at most the bytes of its
longest entry, and a character is at least one byte, so a text of ``n``
characters is at least ``n / longest`` tokens. The longest entries are
runs of one character (whitespace, ``=``, ``-``): the harness's tiny Llama
tokenizer, 4,096 entries, already has a newline and 40 spaces (41 bytes);
large vocabularies have longer runs. 1,024 is far above any entry we know of,
so the bound is never wrong: it refuses only a pack that cannot fit.
It is still tight enough to catch the costly case: a 50 MB file against a
32k window is at least 51,200 tokens, refused before anything is tokenized.
Packs it cannot prove too large are counted (and refused after counting).
"""


def check_budget(pack: Pack, budget: Budget) -> None:
    """Raise :class:`~longctx.errors.BudgetError` (largest folders and files named) unless ``pack`` fits."""
    total = pack.total_tokens
    assert total is not None
    if total <= budget.prompt_budget:
        return
    files = sorted(
        ((section.path, section.tokens or 0) for section in pack.documents if section.path is not None),
        key=lambda item: (-item[1], item[0]),
    )
    folders: dict[str, int] = {}
    for path, tokens in files:
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth]) + "/"
            folders[folder] = folders.get(folder, 0) + tokens
    top_folders = sorted(folders.items(), key=lambda item: (-item[1], item[0]))[:_LARGEST_SHOWN]
    top_files = files[:_LARGEST_SHOWN]
    excess = total - budget.prompt_budget
    estimated = " (estimated)" if pack.estimated else ""

    def listed(items: Sequence[tuple[str, int]]) -> str:
        return "; ".join(f"{path} {tokens:,}" for path, tokens in items) or "none"

    earlier = sum(section.tokens or 0 for section in pack.earlier_copies)
    layered = (
        f" Of these, {earlier:,} are earlier copies of files changed since the pack's base commit"
        " (max_stale_share=0 leaves them out)."
        if earlier
        else ""
    )
    message = (
        f"the pack needs {total:,} tokens{estimated} but the budget is {budget.describe()}: "
        f"{excess:,} tokens must go.{layered} Largest folders: {listed(top_folders)}. "
        f"Largest files: {listed(top_files)}. Exclude some of them, or split the pack into shards "
        "(--shard on `longctx ask` and `batch`; ShardedSession in Python)."
    )
    raise BudgetError(
        message,
        total_tokens=total,
        budget_tokens=budget.prompt_budget,
        largest=tuple(top_folders) + tuple(top_files),
    )


def check_lower_bound(sizes: Sequence[tuple[str, int]], budget: Budget, *, read_all: bool = True) -> None:
    """Raise :class:`~longctx.errors.BudgetError` when the characters alone prove a pack cannot fit.

    ``sizes``: each document's path and characters (:func:`character_sizes`).
    No tokenizer is asked: the bound is characters / :data:`MAX_CHARS_PER_TOKEN`,
    never above the true count, so a pack refused here would be refused after
    counting too, only later (a server tokenizing 50 MB takes minutes and goes
    on after the client gave up). The error names the largest files; with
    ``read_all`` False, ``sizes`` are the files read before the reading
    stopped (:class:`LowerBound`), and the error says so.
    """
    total = sum(size for _, size in sizes)
    least = total // MAX_CHARS_PER_TOKEN
    if least <= budget.prompt_budget:
        return
    by_path: dict[str, int] = {}
    for path, size in sizes:
        by_path[path] = by_path.get(path, 0) + size
    largest = sorted(by_path.items(), key=lambda item: (-item[1], item[0]))[:_LARGEST_SHOWN]
    shown = "; ".join(f"{path} {size:,} characters" for path, size in largest)
    whose, stopped = ("its", "")
    if not read_all:
        whose, stopped = "the files read so far hold", ", and no further file was read"
    raise BudgetError(
        f"the pack cannot fit: {whose} {total:,} characters, at least {least:,} tokens (no token holds"
        f" more than {MAX_CHARS_PER_TOKEN:,} characters), over the budget of {budget.describe()};"
        f" nothing was tokenized{stopped}. Largest files: {shown}. Exclude some of them (--exclude,"
        " --max-file-bytes), or use a larger context.",
        total_tokens=least,
        budget_tokens=budget.prompt_budget,
        largest=tuple((path, size // MAX_CHARS_PER_TOKEN) for path, size in largest),
    )


class LowerBound:
    """:func:`check_lower_bound` while a corpus is read: ``add`` each text as it is decoded.

    Given as ``on_text`` to :func:`~longctx.sources.corpus.load_corpus` (or
    :func:`~longctx.sources.corpus.stream_corpus`), it raises the bound's
    :class:`~longctx.errors.BudgetError` as soon as the characters read
    so far prove the pack cannot fit, so that neither the rest of a 50 MB
    file's passes (special tokens, credentials, hashing, rendering) nor the
    files after it cost anything. A file the credential pass would have
    skipped counts too: the error names it, to be excluded.
    """

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.sizes: list[tuple[str, int]] = []
        self._least_chars = (budget.prompt_budget + 1) * MAX_CHARS_PER_TOKEN  # the first total it refuses
        self._total = 0

    def add(self, path: str, characters: int) -> None:
        """Count ``path``'s ``characters``; raise the bound's error once the total proves too much."""
        self.sizes.append((path, characters))
        self._total += characters
        if self._total >= self._least_chars:
            check_lower_bound(self.sizes, self.budget, read_all=False)


def refusal_advice(sizes: Sequence[tuple[str, int]]) -> str:
    """What a pack refused for its size should do: its largest files named, then exclude or shard."""
    largest = sorted(sizes, key=lambda item: (-item[1], item[0]))[:_LARGEST_SHOWN]
    shown = "; ".join(f"{path} {size:,} characters" for path, size in largest) or "none"
    return (
        f"Largest files: {shown}. Exclude some of them (--exclude, --max-file-bytes), split the pack into"
        " shards (--shard on `longctx ask` and `batch`; ShardedSession in Python), or use a larger context."
    )


def character_sizes(documents: Iterable[Document]) -> list[tuple[str, int]]:
    """Each document's path and length in characters, for :func:`check_lower_bound`."""
    return [(document.path, len(document.text)) for document in documents]


def build_shards(
    corpus: Corpus,
    *,
    budget: Budget,
    tokenizer: Tokenizer | None = None,
    store: Store | None = None,
    image_counter: ImageTokenCounter | None = None,
) -> ShardedPack:
    """Split ``corpus`` into packs that each fit ``budget``, filled greedily in corpus order.

    A shard holds the next documents while they fit with its own listing
    (the paths of its documents; the skipped paths go in the last shard).
    Adding documents at the end of the corpus leaves the earlier shards
    unchanged (the first shard only gains its part number when a second
    shard appears). A corpus that fits is one shard without a part number,
    byte-identical to :func:`build_pack`'s pack (for a layered corpus, to
    the pack of its current files in the same order: shards leave out the
    earlier copies and the changes marker). Without a tokenizer the
    documented estimate is used.

    Raises :class:`~longctx.errors.BudgetError` naming a document that alone
    does not fit (longctx does not cut documents). An image document costs
    its text and its image (counted by ``image_counter``, else the estimate).
    """
    tokenizer = tokenizer or EstimateTokenizer()
    counter = PackCounter(tokenizer, store, image_counter)
    # Shards hold the current files once each: the earlier copies of a
    # layered corpus serve one pack's prefix, not a split.
    documents = tuple(document for document in corpus.documents if not document.earlier)
    for document in documents:
        check_lower_bound(
            character_sizes((document,)), budget
        )  # a document that alone cannot fit, before counting
    texts = document_section_texts(documents)
    counts = count_texts(tokenizer, texts, [section_fingerprint(text) for text in texts], store)
    # What each document costs a shard: its text, and its image where it is one.
    costs = [
        tokens + (counter.image_tokens([document.image]).tokens or 0 if document.image is not None else 0)
        for document, tokens in zip(documents, counts, strict=True)
    ]
    skipped = skipped_entries(corpus)
    notes = included_notes(corpus)
    chains = cached_counts(
        tokenizer, [folder_lines(document.path, notes.get(document.path)) for document in documents], store
    )
    empty = assemble(Sections([], [], render_listing(skipped, part=1), part=1), counter)
    fixed = empty.total_tokens or 0  # header, opening, listing tags and skipped paths, boundary, template
    _refuse_what_cannot_fit(documents, costs, chains, fixed=fixed, budget=budget)
    maker = _ShardMaker(documents, texts, counts, counter, notes)
    groups = _greedy_groups(costs, chains, budget.prompt_budget - fixed)
    shards = _fill_shards(maker, groups, skipped, budget)
    digest = hashlib.sha256("\n".join(shard.fingerprint for shard in shards).encode()).hexdigest()
    return ShardedPack(shards=tuple(shards), budget=budget, fingerprint=digest)


def _refuse_what_cannot_fit(
    documents: Sequence[Document], counts: Sequence[int], chains: Sequence[int], *, fixed: int, budget: Budget
) -> None:
    """Raise :class:`BudgetError` when even an empty pack, or one document alone, is over ``budget``."""
    limit = budget.prompt_budget
    if fixed > limit:
        raise BudgetError(
            f"even an empty pack needs {fixed:,} tokens (header, listing of skipped paths, chat template), "
            f"more than the budget of {budget.describe()}",
            total_tokens=fixed,
            budget_tokens=limit,
        )
    for document, tokens, chain in zip(documents, counts, chains, strict=True):
        if fixed + tokens + chain > limit:
            raise BudgetError(
                f"{document.path} alone needs {tokens:,} tokens, more than a shard can hold "
                f"(budget {budget.describe()}, of which {fixed:,} go to the header, listing and template); "
                "exclude it or use a larger context",
                total_tokens=fixed + tokens + chain,
                budget_tokens=limit,
                largest=((document.path, tokens),),
            )


def _fill_shards(
    maker: _ShardMaker, groups: list[tuple[int, int]], skipped: list[ListingEntry], budget: Budget
) -> list[Pack]:
    """The shards of ``groups`` (the skipped paths in the last), each moved back a document while over."""
    limit = budget.prompt_budget
    shards: list[Pack] = []
    index = 0
    while index < len(groups):
        start, stop = groups[index]
        last = index == len(groups) - 1
        part = None if len(groups) == 1 else index + 1
        shard = maker.shard(start, stop, skipped if last else [], part)
        if (shard.total_tokens or 0) > limit and stop - start > 1:
            # The upper bound was not one (a tokenizer whose counts do not
            # add up): give the last document to the next shard and redo.
            groups[index] = (start, stop - 1)
            if last:
                groups.append((stop - 1, stop))
            else:
                groups[index + 1] = (stop - 1, groups[index + 1][1])
            continue
        if (shard.total_tokens or 0) > limit:
            check_budget(shard, budget)
        shards.append(shard)
        index += 1
    if not shards:
        shards.append(maker.shard(0, 0, skipped, None))
    if len(shards) == 1 and shards[0].part is not None:
        shards[0] = maker.shard(0, len(maker.documents), skipped, None)
    return shards


def _greedy_groups(counts: Sequence[int], chains: Sequence[int], room: int) -> list[tuple[int, int]]:
    """Half-open index ranges of documents: each as long as its documents and listing lines fit ``room``."""
    groups: list[tuple[int, int]] = []
    start = 0
    used = 0
    for index, (tokens, chain) in enumerate(zip(counts, chains, strict=True)):
        need = tokens + chain
        if index > start and used + need > room:
            groups.append((start, index))
            start, used = index, 0
        used += need
    if start < len(counts):
        groups.append((start, len(counts)))
    return groups


@record_type
class _ShardMaker:
    """The counted documents of a corpus, ready to be cut into shards."""

    documents: Sequence[Document]
    texts: Sequence[str]
    counts: Sequence[int]
    counter: PackCounter
    notes: dict[str, str]

    def shard(self, start: int, stop: int, skipped: list[ListingEntry], part: int | None) -> Pack:
        """The pack of documents ``start`` to ``stop`` (half-open), listing them and ``skipped``."""
        documents = self.documents[start:stop]
        paths = [document.path for document in documents if is_listed(document)]
        listing = render_listing(
            [*(ListingEntry(path, note=self.notes.get(path)) for path in paths), *skipped], part=part
        )
        names = [DOCUMENT_PREFIX + document.path for document in documents]
        images = [(index, document.image) for index, document in enumerate(documents) if document.image]
        sections = Sections(
            self.texts[start:stop],
            names,
            listing,
            part=part,
            document_counts=self.counts[start:stop],
            images=images,
        )
        return assemble(sections, self.counter)
