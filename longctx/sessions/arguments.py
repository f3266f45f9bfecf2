"""Argument checks: what a question call takes, refused at the call, before anything is sent.

:class:`AskOptions` and :class:`AskManyOptions` are the keywords the calls
take; :func:`checked_ask` and :func:`checked_ask_many` check one call's
arguments whole (an unknown keyword, a question that is no string or is
blank, an answer bound or a concurrency its option field refuses, ``cite``
with ``schema``) and return them as :class:`AskCall`, :class:`AskManyCall`.
Every session kind's ``plan_ask`` and ``plan_ask_many`` run them when called,
not when the plan they return is carried out (a plan is a generator, which
runs nothing until its first step is asked for), so ``stream("")`` fails at
the line that made it, like ``ask("")``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from longctx.errors import ConfigError
from longctx.options.groups import RequestOptions
from longctx.recordtypes import record_type
from longctx.sessions.answers import Answer

if TYPE_CHECKING:
    from longctx.schemas import AnswerSchema, SchemaSpec


__all__ = [
    "AskCall",
    "AskManyCall",
    "AskManyOptions",
    "AskOptions",
    "answer_bound",
    "asked_how",
    "checked_ask",
    "checked_ask_many",
    "checked_concurrency",
    "checked_question",
    "refuse_unknown",
]


class AskOptions(TypedDict, total=False):
    """The keywords of ``ask``, which ``aask``, ``stream``, ``astream`` and ``plan_ask`` take too.

    ``max_tokens``: the answer's bound (default: the request options').
    ``cite``: the answer cites where it rests, each citation checked against
    the pack (:mod:`longctx.citations`). ``schema``: the answer is decoded to
    a JSON Schema and validated, its value in :attr:`Answer.data`
    (:mod:`longctx.schemas`: a pydantic model class, a JSON Schema dict, a
    concise spec or an :class:`~longctx.schemas.AnswerSchema`). Not both.
    ``ask_many`` takes them too (:class:`AskManyOptions`).
    """

    max_tokens: int | None
    cite: bool
    schema: SchemaSpec | None


class AskManyOptions(AskOptions, total=False):
    """The keywords of ``ask_many`` on every session kind.

    ``max_tokens``: the answer's bound (default: the request options').
    ``concurrency``: how many in flight (default: the request options', else
    what was measured fastest for the engine). ``on_answer``: hears of each
    answer as it is stored. ``keys``: the caller's name for each question,
    stored with its answer; a key that already has an answer is refused
    before anything is sent, unless ``reuse_answered``: then its question
    is not asked and its stored answer comes back in the batch (without
    ``keys``, each question's key is :func:`~longctx.sessions.siblings.batch_keys`'
    for this session, so a batch stopped by Ctrl-C or a dead server is
    finished by asking the same questions again with ``reuse_answered``).
    ``cite`` and ``schema`` (:class:`AskOptions`) hold for every question.
    """

    concurrency: int | None
    on_answer: Callable[[Answer], None] | None
    keys: Sequence[str] | None
    reuse_answered: bool


def asked_how(options: Mapping[str, Any]) -> tuple[bool, AnswerSchema | None]:
    """``cite`` and the :class:`AnswerSchema` of ``options`` (:class:`AskOptions`), checked before sending.

    A schema that is none, or ``cite`` with a schema (a cited answer ends in
    prose sources, which no JSON answer can), is a
    :class:`~longctx.errors.ConfigError`.
    """
    cite, spec = options.get("cite", False), options.get("schema")
    if not isinstance(cite, bool):  # cite="yes" or "no" would both be true
        raise ConfigError(f"cite must be True or False, not {cite!r}")
    if spec is None:
        return cite, None
    if cite:
        raise ConfigError("cite and schema cannot be asked together: a cited answer ends in prose sources")
    from longctx.schemas import answer_schema  # only a typed question's: a new process loads it then

    return cite, answer_schema(spec)


@record_type
class AskCall:
    """One question's arguments, checked: the question, its answer bound, and what it asks for."""

    question: str
    max_tokens: int
    cite: bool = False
    schema: AnswerSchema | None = None


@record_type
class AskManyCall:
    """A sibling batch's arguments, checked: questions, answer bound, concurrency, what each asks for."""

    questions: Sequence[str]
    max_tokens: int
    concurrency: int | None
    cite: bool = False
    schema: AnswerSchema | None = None


def checked_ask(
    request: RequestOptions, question: object, options: Mapping[str, Any], where: str = "ask"
) -> AskCall:
    """The arguments of one question (``options``: :class:`AskOptions`), checked; ``where`` names the call.

    An unknown keyword or a question that is no string is a
    :class:`TypeError`; a blank question, a ``max_tokens`` its option field
    refuses, or ``cite`` with ``schema``, a :class:`~longctx.errors.ConfigError`.
    """
    refuse_unknown(options, AskOptions, where)
    checked = checked_question(question)
    max_tokens = answer_bound(request, options.get("max_tokens"))
    cite, schema = asked_how(options)
    return AskCall(checked, max_tokens, cite, schema)


def refuse_unknown(keywords: Mapping[str, object], accepted: type, where: str) -> None:
    """Raise :class:`TypeError` naming each keyword of ``keywords`` that the TypedDict ``accepted`` lacks.

    ``**options: Unpack[...]`` is checked only by a type checker; this is the check at run time.
    """
    known = set(getattr(accepted, "__required_keys__", ())) | set(getattr(accepted, "__optional_keys__", ()))
    unknown = sorted(set(keywords) - known)
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s): {', '.join(unknown)}")


def checked_ask_many(
    request: RequestOptions, questions: Sequence[str], options: Mapping[str, Any]
) -> AskManyCall:
    """The arguments of a batch (``options``: :class:`AskManyOptions`), checked, on every session kind.

    An unknown keyword, one string given as the questions (each character
    would be a question) or a question that is no string is a
    :class:`TypeError` (naming its index); a ``max_tokens`` or ``concurrency``
    its option field's rule refuses, a blank question, no question, or
    ``cite`` with ``schema``, a :class:`~longctx.errors.ConfigError`.
    """
    refuse_unknown(options, AskManyOptions, "ask_many")
    if isinstance(questions, str) or not isinstance(questions, Sequence):
        one = " (ask(question) asks one)" if isinstance(questions, str) else ""
        raise TypeError(f"ask_many takes a list of questions, not {type(questions).__name__}{one}")
    for index, question in enumerate(questions):
        checked_question(question, f"questions[{index}]")
    max_tokens = answer_bound(request, options.get("max_tokens"))
    concurrency = checked_concurrency(options.get("concurrency"))
    if not questions:
        raise ConfigError("ask_many needs at least one question")
    cite, schema = asked_how(options)
    return AskManyCall(questions, max_tokens, concurrency, cite, schema)


def checked_question(question: object, name: str = "question") -> str:
    """``question`` if it is a non-blank ``str``; else a TypeError (a ConfigError when blank) naming ``name``.

    A question of another type (None, a number) is refused before anything
    is sent; ``ask_many`` names the index (``questions[2]``).
    """
    if not isinstance(question, str):
        raise TypeError(f"{name} must be a str, not {type(question).__name__} ({question!r:.60})")
    if not question.strip():
        raise ConfigError("the question is empty" if name == "question" else f"{name} is empty")
    return question


def answer_bound(request: RequestOptions, max_tokens: int | None) -> int:
    """A per-call ``max_tokens``, checked by the option field's own rule; None: ``request``'s.

    0 is refused as the option object refuses it (it is not "not given"), and
    a negative bound never reaches the server.
    """
    if max_tokens is None:
        return request.max_tokens
    checked: int = RequestOptions.checked("max_tokens", max_tokens)
    return checked


def checked_concurrency(concurrency: int | None) -> int | None:
    """A per-call ``concurrency``, checked by :attr:`RequestOptions.concurrency`'s rule (None: not given)."""
    checked: int | None = RequestOptions.checked("concurrency", concurrency)
    return checked
