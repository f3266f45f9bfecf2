"""Sessions over the pack of paths: :class:`RepoSession` and :class:`DocSession`.

Constructing one reads nothing and contacts no server. The first call that
needs the pack (a question, :attr:`CorpusSession.pack`, :attr:`~CorpusSession.corpus`)
loads the corpus, connects, counts the pack with the server's own
tokenizer and checks it against the server's window, reporting each step
through ``on_progress``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import replace
from typing import Any, Final, Self, TypedDict, Unpack, cast

from longctx.backends.base import Backend
from longctx.backends.tokenizer import CountWatch, watched_counts
from longctx.errors import LongctxError
from longctx.options.groups import CorpusOptions, RequestOptions, ServerOptions
from longctx.packing import Budget, Pack, build_pack, build_shards
from longctx.packing.budget import LowerBound, character_sizes, refusal_advice
from longctx.sessions.changes import ChangeTracker, corpus_hashes
from longctx.sessions.resources import Progress
from longctx.sessions.session import Session
from longctx.sources.corpus import Corpus, check_sources, load_corpus
from longctx.store import Store, StoredPack
from longctx.tokens.tokenizers import EstimateTokenizer, Tokenizer

__all__ = [
    "CheckedSessionOptions",
    "CorpusSession",
    "CorpusSessionOptions",
    "DocSession",
    "Paths",
    "RepoSession",
    "as_paths",
    "checked_session_options",
    "pack_for_server",
    "server_budget",
    "server_corpus_options",
    "shards_for_server",
]

Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def as_paths(paths: Paths) -> tuple[str | os.PathLike[str], ...]:
    """``paths`` as a tuple: one path may be given bare.

    Anything else than a path (``str``, ``os.PathLike``) or a sequence of
    them is a TypeError naming it (``RepoSession(42)``), raised where the
    object is built rather than when the files are read.
    """
    if isinstance(paths, (str, os.PathLike)):
        return (paths,)
    if not isinstance(paths, Sequence) or isinstance(paths, bytes):
        raise TypeError(
            f"paths must be a path or a sequence of paths, not {type(paths).__name__} ({paths!r:.60})"
        )
    for index, path in enumerate(paths):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"paths[{index}] must be a str or os.PathLike, not {type(path).__name__} ({path!r:.60})"
            )
    return tuple(paths)


def _server_tokenizer(backend: Backend) -> Tokenizer:
    return backend.tokenizer() if backend.info.profile.tokenizes else EstimateTokenizer()


def server_corpus_options(options: CorpusOptions, backend: Backend, store: Store) -> CorpusOptions:
    """``options`` with the served model's special-token spellings added to ``special_tokens``.

    They are learned by tokenizing candidate spellings on the server
    (:meth:`~longctx.backends.tokenizer.ServerTokenizer.special_spellings`)
    once per tokenizer identity, and kept in ``store``. A server without a
    tokenize route adds nothing (the default spellings are broken anyway).
    """
    if not backend.info.profile.tokenizes:
        return options
    # Imported here: the candidate list is only needed when a server is asked.
    from longctx.sources.special_tokens import CANDIDATE_SPELLINGS

    tokenizer = backend.tokenizer()
    learned = store.caches.special_tokens(tokenizer.identity)
    if learned is None:
        learned = tokenizer.special_spellings(CANDIDATE_SPELLINGS)
        store.caches.save_special_tokens(tokenizer.identity, learned)
    if set(learned) <= set(options.special_tokens):
        return options
    return replace(options, special_tokens=(*options.special_tokens, *learned))


def server_pdf_pages(options: CorpusOptions, backend: Backend, corpus: Corpus) -> CorpusOptions:
    """``options`` with ``pdf_pages="server"`` made ``auto`` where that matters and the model takes images.

    ``corpus`` is what ``options`` read (``server`` reads as ``text``): only a
    PDF page without text would go as an image, so the server is asked (the
    model card where the engine has one, else a probe:
    :meth:`~longctx.backends.images.ImageCounter.takes_images`) only when
    ``corpus`` has one; a server that does not say gets text only.
    """
    if options.pdf_pages != "server" or not _pages_without_text(corpus):
        return options
    takes = False
    with suppress(LongctxError):
        takes = backend.image_counter().takes_images() is True
    return replace(options, pdf_pages="auto") if takes else options


def _pages_without_text(corpus: Corpus) -> bool:
    return any(
        note.startswith("page ") and ("no extractable text" in note or "text extraction failed" in note)
        for entry in corpus.manifest.included
        for note in entry.notes
    )


def server_budget(backend: Backend, request: RequestOptions) -> Budget | None:
    """The server's window less the answer and question room of ``request``; None for an unknown window."""
    window = backend.info.context_length
    if not window:
        return None
    return Budget(
        window,
        reserved_output_tokens=request.max_tokens,
        reserved_question_tokens=request.reserved_question_tokens,
    )


def pack_for_server(corpus: Corpus, backend: Backend, *, store: Store, request: RequestOptions) -> Pack:
    """The pack of ``corpus`` counted with the server's own tokenizer and checked against its window.

    On a server without a tokenize route (or an unknown window) the
    documented estimate is used and the pack says ``estimated``. Images
    are counted by the server (:meth:`~longctx.backends.base.Backend.image_counter`,
    asked only when the corpus holds images). Raises
    :class:`~longctx.errors.BudgetError` when it does not fit (see
    :func:`shards_for_server`).
    """
    return build_pack(
        corpus,
        tokenizer=_server_tokenizer(backend),
        store=store,
        budget=server_budget(backend, request),
        image_counter=backend.image_counter(),
    )


def shards_for_server(
    corpus: Corpus, backend: Backend, *, store: Store, request: RequestOptions
) -> tuple[Pack, ...]:
    """``corpus`` split into packs that each fit the server's window (one when the window is unknown).

    Images are counted by the server, as in :func:`pack_for_server`.
    """
    tokenizer = _server_tokenizer(backend)
    budget = server_budget(backend, request)
    images = backend.image_counter()
    if budget is None:
        return (build_pack(corpus, tokenizer=tokenizer, store=store, image_counter=images),)
    return build_shards(corpus, budget=budget, tokenizer=tokenizer, store=store, image_counter=images).shards


class _AsGiven(TypedDict, total=False):
    """The keywords of a session over paths that :func:`checked_session_options` passes on as given."""

    backend: Backend | None
    store: Store | None
    corpus: CorpusOptions | None
    request: RequestOptions | None
    title: str | None
    on_progress: Progress | None


class CorpusSessionOptions(_AsGiven, total=False):
    """The keyword arguments of every session over paths (:class:`RepoSession`, :class:`DocSession`,
    :class:`~longctx.sessions.sharded.ShardedSession`), written once.

    ``backend`` a connection the caller owns (else one is made to ``server``
    on first use and owned by the session); ``server`` a
    :class:`~longctx.options.groups.ServerOptions` or just the URL(s), or instead
    the names every OpenAI-compatible client uses, ``base_url``, ``model``,
    ``api_key`` (one way or the other, not both); ``store`` likewise;
    ``corpus`` chooses the documents; ``request`` how each request is made;
    ``title`` names the session (default: the corpus's root folder);
    ``on_progress`` hears what is happening (reading, connecting, counting).
    See :func:`checked_session_options`.
    """

    server: ServerOptions | str | Sequence[str] | None
    base_url: str | Sequence[str] | None
    model: str | None
    api_key: str | None


class CheckedSessionOptions(_AsGiven, total=False):
    """:class:`CorpusSessionOptions` after :func:`checked_session_options`: the server as one object."""

    server: ServerOptions | None


_SERVER_NAMES: Final = ("base_url", "model", "api_key")
_OPTION_TYPES: Final[dict[str, type]] = {
    "corpus": CorpusOptions,
    "request": RequestOptions,
    "store": Store,
    "backend": Backend,
}


def checked_session_options(kind: str, options: Mapping[str, Any]) -> CheckedSessionOptions:
    """A session's keywords checked at once, with ``base_url``, ``model``, ``api_key`` made ``server``.

    ``kind`` names the session class in the messages. A keyword the
    sessions do not take, both ``server`` and one of ``base_url``,
    ``model``, ``api_key``, or an option of the wrong type (``request={...}``
    rather than :class:`~longctx.options.groups.RequestOptions`) raises
    :class:`TypeError` naming it, rather than being ignored or failing at
    the first question. A URL (or URLs) given as ``server`` is
    ``ServerOptions(base_url=...)``, as :func:`~longctx.backends.connect` takes it.
    """
    unknown = [name for name in options if name not in CorpusSessionOptions.__annotations__]
    if unknown:
        raise TypeError(f"{kind}() got an unexpected keyword argument {unknown[0]!r}")
    checked: dict[str, Any] = {name: value for name, value in options.items() if name not in _SERVER_NAMES}
    named = {name: options[name] for name in _SERVER_NAMES if options.get(name) is not None}
    server = options.get("server")
    if server is not None and named:
        raise TypeError(
            f"{kind}() takes server=ServerOptions(...) or {', '.join(f'{n}=' for n in named)}, not both"
        )
    if named:
        server = ServerOptions(**named)
    elif isinstance(server, (str, list, tuple)):
        server = ServerOptions(base_url=server)
    if server is not None and not isinstance(server, ServerOptions):
        raise TypeError(f"{kind}(server=...) takes a ServerOptions or a URL, not {type(server).__name__}")
    checked["server"] = server
    for name, wanted in _OPTION_TYPES.items():
        value = checked.get(name)
        if value is not None and not isinstance(value, wanted):
            hint = f" (write {wanted.__name__}(**...))" if isinstance(value, Mapping) else ""
            raise TypeError(f"{kind}({name}=...) takes a {wanted.__name__}, not {type(value).__name__}{hint}")
    return cast(CheckedSessionOptions, checked)


class CorpusSession(Session):
    """A session over the pack of ``paths``, prepared on first use.

    Takes :class:`CorpusSessionOptions`: ``corpus`` chooses the documents
    (:class:`~longctx.options.groups.CorpusOptions`); the others are
    :class:`~longctx.sessions.session.Session`'s. The title defaults to the
    corpus's root folder name.
    """

    def __init__(self, paths: Paths, **given: Unpack[CorpusSessionOptions]) -> None:
        options = checked_session_options(type(self).__name__, given)
        super().__init__(
            options.get("backend"),
            None,
            server=options.get("server"),
            store=options.get("store"),
            request=options.get("request"),
            title=options.get("title"),
            on_progress=options.get("on_progress"),
        )
        self.paths = as_paths(paths)
        self.corpus_options = options.get("corpus") or CorpusOptions()
        self._corpus: Corpus | None = None
        self._full_pack: Pack | None = None

    def _path_strings(self) -> list[str]:
        # Absolute: a resumed session may run in another folder.
        return [os.path.abspath(os.fspath(path)) for path in self.paths]

    def source_roots(self) -> tuple[str, ...]:
        """The paths the pack was made from, absolute."""
        return tuple(self._path_strings())

    @property
    def corpus(self) -> Corpus:
        """The documents and manifest the pack was made from (read on first use)."""
        self._prepare()
        assert self._corpus is not None
        return self._corpus

    @property
    def full_pack(self) -> Pack:
        """The pack with its sections and counts (prepared on first use)."""
        self._prepare()
        assert self._full_pack is not None
        return self._full_pack

    @classmethod
    def _blank(
        cls, pack: StoredPack | None, request: RequestOptions, title: str, settings: Mapping[str, Any]
    ) -> Self:
        """The session a stored record describes: its stored pack, its paths and corpus options.

        The pack is the one its history was built on; the files are read
        again only if :attr:`corpus` or :attr:`full_pack` is asked for.
        """
        stored = settings.get("corpus_session") or {}
        session = cls(
            tuple(stored.get("paths") or ()),
            request=request,
            title=title,
            corpus=CorpusOptions.from_dict(stored.get("corpus") or {}),
        )
        if pack is not None:
            session._set_pack(pack)
        return session

    def _kind_settings(self) -> dict[str, Any]:
        return {
            "session_kind": self.session_kind,
            "corpus_session": {"paths": self._path_strings(), "corpus": self.corpus_options.to_dict()},
        }

    @property
    def pack(self) -> StoredPack | None:
        if self._pack is None:
            self._prepare()
        return self._pack

    def _prepare(self) -> None:
        with self._resources.lock:
            if self._full_pack is not None:
                return
            check_sources(self.paths)  # a missing path fails before any server is contacted
            backend = self.backend
            options = server_corpus_options(self.corpus_options, backend, self.store)
            self._resources.progress("reading files")
            # Taken before the files are read: a change made while they are
            # read shows up at the next turn rather than never.
            follows = self.request.follow_changes
            state = ChangeTracker.state_of(self._path_strings(), options) if follows else None
            # The window's lower bound is checked as each text is decoded: a corpus
            # that cannot fit is refused before the rest is read, scanned or counted.
            budget = server_budget(backend, self.request)
            bound = None if budget is None else LowerBound(budget)
            corpus = load_corpus(
                self.paths, options, store=self.store, on_text=None if bound is None else bound.add
            )
            if (images := server_pdf_pages(options, backend, corpus)) is not options:
                # Pages without text, and a model that takes images: read again, those pages as images.
                options = images
                bound = None if budget is None else LowerBound(budget)
                corpus = load_corpus(
                    self.paths, options, store=self.store, on_text=None if bound is None else bound.add
                )
            self._resources.progress(f"{len(corpus.manifest.included)} documents")
            engine = backend.info.engine
            self._resources.progress(f"counting tokens with {engine}'s tokenizer")

            def counted(done: int, total: int) -> None:
                share = f"{done / 1e6:.1f} of {total / 1e6:.1f} M characters"
                self._resources.progress(f"counting tokens with {engine}'s tokenizer: {share}")

            # A text too large for the window is refused as soon as its counted part proves it.
            watch = CountWatch(
                limit=None if budget is None else budget.prompt_budget,
                on_progress=counted,
                budget="" if budget is None else budget.describe(),
                advice=refusal_advice(character_sizes(corpus.documents)),
            )
            with watched_counts(watch):
                packed = pack_for_server(corpus, backend, store=self.store, request=self.request)
            self._corpus, self._full_pack = corpus, packed
            if self._pack is not None:
                return  # a restored session keeps the pack (and tracker) its history was built on
            if follows:
                self._tracker = ChangeTracker(self._path_strings(), options, corpus_hashes(corpus), state)
            self._title = self._title or corpus.root or "documents"
            # Converted here, once: requests read the stored form's prefix.
            super()._set_pack(packed)


class RepoSession(CorpusSession):
    """A session over a repository (or folder): ``RepoSession("repo/").ask("...")``.

    Resuming one (``RepoSession.resume(id)``, :func:`longctx.resume`) gives back a RepoSession over
    the same paths and its stored pack; sessions stored before longctx recorded their kind resume as
    a plain :class:`~longctx.sessions.session.Session`.

    The corpus is loaded with :func:`longctx.sources.corpus.load_corpus` (``stability``
    order in git repositories: files that change least come first, layered
    as of a recent base commit, see ``CorpusOptions.max_stale_share``),
    packed and counted with the server's own tokenizer, and checked against
    the server's window less ``max_tokens`` and ``reserved_question_tokens``
    of the request options. The first question raises
    :class:`~longctx.errors.BudgetError` naming the largest files and
    folders when it does not fit (see :class:`longctx.sessions.sharded.ShardedSession`),
    and :class:`~longctx.errors.ServerUnreachable` when no server answers.
    """

    session_kind = "repo"


class DocSession(CorpusSession):
    """A session over documents (PDFs, notebooks, text files, folders of them).

    ``DocSession(["report.pdf", "notes/"]).ask("...")``; otherwise as
    :class:`RepoSession`.
    """

    session_kind = "doc"
