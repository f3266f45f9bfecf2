"""One candidate file on disk to a Document, or to a Skip with its reason.

Each file is opened once and read once. The steps, in order (the first that
fails decides the skip reason):

1. ``lstat``; a symbolic link must resolve (``symlink-loop``, broken links
   are ``unreadable``) to a regular file inside the root
   (``symlink-outside-root``); a link is included under its own path with a
   note naming its target, so its content may appear twice.
2. Only regular files are read (``not-a-regular-file``: FIFOs, sockets,
   devices, links to folders). Opening never blocks.
3. A file named like a credential store (``.env``, ``*.pem``...) is a
   ``secret`` unless secrets are allowed.
4. Larger than the per-file limit: ``too-large`` (not read).
5. Read errors: ``unreadable`` with the system's message. The first 8 KiB
   are read first: binary content (unless the file looks like a PDF) is
   ``binary`` and the rest is not read.
6. A Git LFS pointer: ``lfs-pointer``.
7. PDF (by ``.pdf`` extension or ``%PDF-`` header): text per page, or
   ``encrypted`` / ``corrupt``; with the image rules, its pages as images
   after it (:mod:`longctx.sources.images`). An image file (``.png``,
   ``.jpg``) when the rules send image files: an image document (a file
   that is no readable PNG or JPEG is ``binary``). Otherwise decoded text
   (``lossy`` when bytes were replaced); a ``.ipynb`` is rendered, or
   ``corrupt``, its image outputs after it when the rules send them.
   The text's length is then told to the caller's ``on_text``, if any,
   which may raise to stop the load there (a pack's budget does when the
   characters already prove the pack cannot fit): the steps below are the
   costly ones on a large text.
8. Special-token spellings in the text are broken
   (:mod:`longctx.sources.special_tokens`), with a note counting them.
9. The text as it would be packed is scanned for credentials: ``secret``
   unless allowed (then included with a note).

No exception escapes for a problem with one file; notes and messages never
carry file content (a parser message that matches a credential pattern is
withheld) nor an absolute path of this machine.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import posixpath
import stat
from collections.abc import Callable
from typing import Final

from longctx.documents import Document
from longctx.recordtypes import record_type
from longctx.sources.decoding import SNIFF_BYTES, decode_text, looks_binary, normalise_newlines
from longctx.sources.files import is_inside, relative_target
from longctx.sources.images import (
    IMAGE_FILE_SUFFIXES,
    ImageDocuments,
    ImageRules,
    image_file_document,
    notebook_image_documents,
    page_image_documents,
)
from longctx.sources.listing import Candidate, Skip, SkipReason
from longctx.sources.notebook import NotebookError, render_notebook
from longctx.sources.pdf import PdfFailure, PdfText, PdfTextCache, extract_pdf_cached
from longctx.sources.secrets import SecretFinding, find_secrets, redact_if_secret, secret_file_rule
from longctx.sources.special_tokens import neutralise

__all__ = ["FileReader", "Included", "document_kind"]

logger = logging.getLogger("longctx.sources")

_MARKDOWN_SUFFIXES: Final = frozenset({".md", ".markdown", ".mdown", ".mkd", ".mkdn", ".mdx"})
_TEXT_SUFFIXES: Final = frozenset(
    {".txt", ".text", ".rst", ".adoc", ".asciidoc", ".org", ".log", ".csv", ".tsv", ".tex", ".rtf"}
)
# Extensionless names that hold code or configuration rather than prose.
_CODE_NAMES: Final = frozenset(
    {
        "makefile",
        "gnumakefile",
        "dockerfile",
        "containerfile",
        "jenkinsfile",
        "vagrantfile",
        "gemfile",
        "rakefile",
        "procfile",
        "brewfile",
        "justfile",
        "cmakelists.txt",
        "build",
        "workspace",
    }
)
_LFS_POINTER_HEADERS: Final = (
    b"version https://git-lfs.github.com/spec/v1",
    b"version https://hawser.github.com/spec/v1",
)
_LFS_POINTER_MAX_BYTES: Final = 1024  # the LFS specification's limit
_PDF_HEADER: Final = b"%PDF-"
_OPEN_FLAGS: Final = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in after lstat must not block
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOFOLLOW", 0)  # a link swapped in after lstat must not be followed
)


@record_type(slots=True)
class Included:
    """A candidate that made it into the corpus, with the notes for its manifest entry.

    ``attachments`` are the image documents that follow ``document`` in the
    corpus (a PDF's pages, a notebook's image outputs: see
    :mod:`longctx.sources.images`); they share its manifest entry.
    """

    document: Document
    notes: tuple[str, ...] = ()
    attachments: tuple[Document, ...] = ()


# Files up to this size are read whole before the binary check (the check
# looks at the first SNIFF_BYTES either way); larger ones head first.
_WHOLE_READ_BYTES: Final = 1 << 18
_READ_CHUNK_BYTES: Final = 1 << 22


class _NotRegular(Exception):
    """The opened file is not a regular file after all (it changed after lstat)."""


def document_kind(name: str) -> str:
    """Return the document kind of a text file called ``name`` (``code``, ``text`` or ``markdown``).

    ``.ipynb`` and ``.pdf`` are decided by the reader, not here.
    """
    lowered = name.lower()
    if lowered in _CODE_NAMES:
        return "code"
    suffix = posixpath.splitext(lowered)[1]
    if suffix in _MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in _TEXT_SUFFIXES:
        return "text"
    if not suffix:
        return "text"  # README, LICENSE, NEWS, AUTHORS...
    return "code"


def _system_message(error: OSError) -> str:
    # str(error) would carry the absolute path of this machine.
    return error.strerror or type(error).__name__


def _file_type(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def _read_bytes(location: str, limit: int, *, may_be_pdf: bool) -> bytes | None:
    """Read at most ``limit + 1`` bytes; None when the first block shows binary content.

    Binary detection needs only the first block, so a large binary file
    (often the biggest files of a repository) is not read any further; a
    file of up to :data:`_WHOLE_READ_BYTES` (most of them) is read in one
    call, its size taken from the open file.
    """
    descriptor = os.open(location, _OPEN_FLAGS)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise _NotRegular
        first = min(status.st_size, limit) + 1 if status.st_size <= _WHOLE_READ_BYTES else SNIFF_BYTES
        head = os.read(descriptor, first)
        if not (may_be_pdf or head.startswith(_PDF_HEADER)) and looks_binary(head):
            return None
        if len(head) < first:  # a regular file reads short only at its end
            return head
        chunks = [head]
        total = len(head)
        while total <= limit:
            chunk = os.read(descriptor, min(limit + 1 - total, _READ_CHUNK_BYTES))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _is_lfs_pointer(data: bytes) -> bool:
    return len(data) < _LFS_POINTER_MAX_BYTES and data.startswith(_LFS_POINTER_HEADERS)


def _describe(findings: tuple[SecretFinding, ...]) -> str:
    return ", ".join(f"{finding.rule} at line {finding.line}" for finding in findings)


class FileReader:
    """Reads candidates for one corpus load, as described in the module docstring.

    It holds the per-file limit, the secret policy, ``on_text`` (called with
    each text's path, characters and bytes on disk once it is decoded, before
    the special-token and credential passes and the hash; what it raises
    propagates), and the resolved folders seen so far (a folder on the way to a file must not lead out of
    the root either: a tracked ``a/b.txt`` whose folder ``a`` was replaced
    by a link to ``/etc`` is not read). Make one per load: the cache assumes
    folders do not change while it lives.
    """

    def __init__(
        self,
        *,
        max_file_bytes: int,
        allow_secrets: bool,
        pdf_cache: PdfTextCache | None = None,
        special_tokens: tuple[str, ...] = (),
        on_text: Callable[[str, int, int], None] | None = None,
        image_rules: ImageRules | None = None,
    ) -> None:
        self.max_file_bytes = max_file_bytes
        self.image_rules = image_rules or ImageRules()
        self.allow_secrets = allow_secrets
        self.special_tokens = special_tokens
        self.on_text = on_text
        self.pdf_cache = pdf_cache
        self._resolved_folders: dict[str, str] = {}

    def _folder_inside_root(self, location: str, root_real: str) -> bool:
        folder = os.path.dirname(location)
        real = self._resolved_folders.get(folder)
        if real is None:
            real = self._resolved_folders[folder] = os.path.realpath(folder)
        return is_inside(real, root_real)

    def read(self, candidate: Candidate) -> Included | Skip:
        """Read ``candidate``: a Document with its notes, or a Skip; never raises for a bad file.

        What ``on_text`` raises is not caught.
        """
        max_file_bytes, allow_secrets = self.max_file_bytes, self.allow_secrets
        path = candidate.path
        notes = list(candidate.notes)
        if candidate.content is not None:
            return self._read_earlier_copy(candidate)
        location = candidate.location
        # The location's own name counts too: a file passed directly is read
        # at its resolved location, which may have another name.
        names = list(dict.fromkeys([posixpath.basename(path), os.path.basename(location)]))
        try:
            status = os.lstat(location)
        except OSError as error:
            return Skip(path, SkipReason.UNREADABLE, (_system_message(error),))
        if not self._folder_inside_root(location, candidate.root_real):
            return Skip(
                path, SkipReason.SYMLINK_OUTSIDE_ROOT, ("a folder on its path links outside the root",)
            )

        if stat.S_ISLNK(status.st_mode):
            link = _followed_link(path, location, candidate.root_real)
            if isinstance(link, Skip):
                return link
            notes.append(f"symbolic link to {link.target}")
            names.append(posixpath.basename(link.target))
            location, status = link.location, link.status

        if not stat.S_ISREG(status.st_mode):
            return Skip(path, SkipReason.NOT_A_REGULAR_FILE, (_file_type(status.st_mode),))
        size = status.st_size

        name_rule = next((rule for rule in map(secret_file_rule, names) if rule), None)
        if name_rule is not None:
            if not allow_secrets:
                return Skip(path, SkipReason.SECRET, (f"file name matches {name_rule}",), size)
            notes.append(f"file name matches {name_rule}; included because secrets are allowed")

        if size > max_file_bytes:
            return Skip(path, SkipReason.TOO_LARGE, (f"{size} bytes; the limit is {max_file_bytes}",), size)
        suffix = posixpath.splitext(names[0].lower())[1]
        try:
            data = _read_bytes(
                location, max_file_bytes, may_be_pdf=suffix == ".pdf" or self._is_image(suffix)
            )
        except _NotRegular:
            return Skip(
                path, SkipReason.NOT_A_REGULAR_FILE, ("changed into something else while read",), size
            )
        except OSError as error:
            return Skip(path, SkipReason.UNREADABLE, (_system_message(error),), size)
        if data is None:
            return Skip(path, SkipReason.BINARY, (), size)
        size = len(data)
        if size > max_file_bytes:
            return Skip(path, SkipReason.TOO_LARGE, (f"grew past the limit of {max_file_bytes} bytes",), size)
        return self._read_content(candidate, data, names, notes)

    def _is_image(self, suffix: str) -> bool:
        return self.image_rules.image_files and suffix in IMAGE_FILE_SUFFIXES

    def _read_earlier_copy(self, candidate: Candidate) -> Included | Skip:
        """Read the base's bytes of a changed file (``candidate.content``), by the rules of a file on disk."""
        data = candidate.content
        assert data is not None
        path, size = candidate.path, len(data)
        name_rule = secret_file_rule(posixpath.basename(path))
        if name_rule is not None and not self.allow_secrets:
            return Skip(path, SkipReason.SECRET, (f"file name matches {name_rule}",), size)
        if size > self.max_file_bytes:
            return Skip(
                path, SkipReason.TOO_LARGE, (f"{size} bytes; the limit is {self.max_file_bytes}",), size
            )
        is_pdf = posixpath.splitext(path.lower())[1] == ".pdf" or data.startswith(_PDF_HEADER)
        if not is_pdf and looks_binary(data[:SNIFF_BYTES]):
            return Skip(path, SkipReason.BINARY, (), size)
        return self._read_content(candidate, data, [posixpath.basename(path)], list(candidate.notes))

    def _read_content(
        self, candidate: Candidate, data: bytes, names: list[str], notes: list[str]
    ) -> Included | Skip:
        """Turn a file's bytes into a Document (PDF, notebook or text), or skip it."""
        path, size, allow_secrets = candidate.path, len(data), self.allow_secrets
        suffix = posixpath.splitext(names[0].lower())[1]
        if _is_lfs_pointer(data):
            return Skip(path, SkipReason.LFS_POINTER, ("the content is stored in Git LFS",), size)

        if self._is_image(suffix) and not data.startswith(_PDF_HEADER):
            return self._read_image(candidate, data, notes)
        lossy = False
        extracted: PdfText | None = None
        notebook_json: str | None = None
        content_sha256: str | None = None  # worked out once, here for a PDF (its cache key), else below
        if suffix == ".pdf" or data.startswith(_PDF_HEADER):
            content_sha256 = hashlib.sha256(data).hexdigest()
            read = extract_pdf_cached(data, content_sha256, self.pdf_cache)
            if isinstance(read, PdfFailure):
                reason = SkipReason.ENCRYPTED if read.reason == "encrypted" else SkipReason.CORRUPT
                return Skip(path, reason, (redact_if_secret(read.message),), size)
            extracted = read
            text, kind = extracted.text, "pdf"
            notes.extend(redact_if_secret(note) for note in extracted.notes)
        else:
            decoded = decode_text(data)
            text, lossy = normalise_newlines(decoded.text), decoded.lossy
            if lossy:
                notes.append(f"not valid {decoded.encoding}: undecodable bytes replaced by U+FFFD")
            elif decoded.detected:
                notes.append(f"decoded from {decoded.encoding} (detected: not valid UTF-8)")
            elif decoded.encoding != "utf-8":
                notes.append(f"decoded from {decoded.encoding}")
            if suffix == ".ipynb":
                notebook_json = text
                try:
                    text = render_notebook(text)
                except NotebookError as error:
                    return Skip(path, SkipReason.CORRUPT, (redact_if_secret(str(error)),), size)
                kind = "notebook"
            else:
                kind = document_kind(names[0])

        if self.on_text is not None:
            # Before the passes below, which a 50 MB text takes most of a second over: breaking
            # special tokens only adds characters, so this count is never above the packed text's.
            self.on_text(path, len(text), size)
        text, broken = neutralise(text, self.special_tokens)
        if broken:
            notes.append(f"{broken} special-token spellings broken (U+200B after their first character)")
        findings = find_secrets(text)
        if findings:
            if not allow_secrets:
                return Skip(path, SkipReason.SECRET, (f"content matches {_describe(findings)}",), size)
            notes.append(f"content matches {_describe(findings)}; included because secrets are allowed")

        document = Document(
            path=path,
            text=text,
            kind=kind,
            sha256=content_sha256 or hashlib.sha256(data).hexdigest(),
            size_bytes=size,
            lossy=lossy,
            last_commit_time=candidate.last_commit_time,
            dirty=candidate.dirty,
            layer=candidate.layer,
            earlier=candidate.earlier,
        )
        images = self._images_of(document, data, extracted, notebook_json)
        return Included(document, (*notes, *images.notes), images.documents)

    def _images_of(
        self, document: Document, data: bytes, extracted: PdfText | None, notebook_json: str | None
    ) -> ImageDocuments:
        """The image documents that follow ``document`` under the image rules (none for an earlier copy)."""
        if document.earlier:  # the base's copy: its text is packed for the prefix's sake, not its pages
            return ImageDocuments()
        if extracted is not None:
            return page_image_documents(document, data, extracted, self.image_rules)
        if notebook_json is not None and self.image_rules.image_files:
            return notebook_image_documents(document, notebook_json)
        return ImageDocuments()

    def _read_image(self, candidate: Candidate, data: bytes, notes: list[str]) -> Included | Skip:
        """An image file as an image document, or ``binary`` when it is no readable PNG or JPEG."""
        parent = Document(
            path=candidate.path,
            text="",
            kind="image",
            sha256=hashlib.sha256(data).hexdigest(),
            size_bytes=len(data),
            last_commit_time=candidate.last_commit_time,
            dirty=candidate.dirty,
            layer=candidate.layer,
            earlier=candidate.earlier,
        )
        document = image_file_document(parent, data)
        if document is None:
            return Skip(candidate.path, SkipReason.BINARY, ("not a readable PNG or JPEG",), len(data))
        image = document.image
        assert image is not None
        return Included(document, (*notes, f"sent as an image ({image.width}x{image.height})"))


@record_type
class _LinkTarget:
    """A symbolic link followed inside the root: the real location, its status, its path in the root."""

    location: str
    status: os.stat_result
    target: str


def _followed_link(path: str, location: str, root_real: str) -> _LinkTarget | Skip:
    """Where the link at ``location`` (``path`` in the corpus) leads, if to a file in the root; else why."""
    try:
        real = os.path.realpath(location, strict=True)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return Skip(path, SkipReason.SYMLINK_LOOP, ("the link never resolves: a loop",))
        if error.errno == errno.ENOENT:
            return Skip(path, SkipReason.UNREADABLE, ("broken link: its target does not exist",))
        return Skip(path, SkipReason.UNREADABLE, (_system_message(error),))
    if not is_inside(real, root_real):
        return Skip(path, SkipReason.SYMLINK_OUTSIDE_ROOT, ("link to a file outside the root",))
    target = relative_target(real, root_real)
    if ".git" in target.split("/"):
        return Skip(path, SkipReason.SYMLINK_OUTSIDE_ROOT, ("link into a .git folder",))
    try:
        status = os.stat(real)
    except OSError as error:
        return Skip(path, SkipReason.UNREADABLE, (_system_message(error),))
    if stat.S_ISDIR(status.st_mode):
        # Only git hands over links to folders (a folder walk follows
        # them); git lists the folder's files under their own paths.
        return Skip(path, SkipReason.NOT_A_REGULAR_FILE, (f"link to the folder {target}/",))
    return _LinkTarget(real, status, target)
