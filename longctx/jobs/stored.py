"""A job as the store keeps it: its savings report by the id the job printed, and what a reused answer cost.

A job is stored as sessions (one per pack and run, each question a sibling
branch) and answer keys (``job:<id>:<item>:...``, :mod:`longctx.jobs.keys`).
:func:`job_report` sums every request of every pack session of a job, over
all its runs; :func:`job_of_session` tells whether a session is one of a
job's (``longctx report`` after a job shows the whole job, not its last pack).
"""

from __future__ import annotations

from longctx.errors import SessionNotFound
from longctx.jobs.keys import job_prefix, stored_for_job
from longctx.report import SavingsReport, build_report
from longctx.store import RequestRecord, Store

__all__ = ["answer_request", "job_of_session", "job_report"]

_ANY_JOB = "job:"


def _job_id(key: str) -> str | None:
    """The job id of an answer key (``job:ID:INDEX:DIGEST:NONCE``, or an older ``job:ID:INDEX``)."""
    rest = key[len(_ANY_JOB) :]
    for parts in (rest.rsplit(":", 3), rest.rsplit(":", 1)):
        if len(parts) > 1 and parts[1].isdigit():
            return parts[0]
    return None


def job_of_session(store: Store, session_id: str) -> str | None:
    """The id of the job whose answers are under ``session_id`` (a pack session or one of its branches)."""
    owners = {turn.session_id: key for key, turn in store.sessions.answered_under(_ANY_JOB).items()}
    mine = [session_id, *(child.id for child in store.sessions.children(session_id))]
    return next((_job_id(owners[sid]) for sid in mine if sid in owners), None)


def job_report(store: Store, job_id: str) -> SavingsReport:
    """The savings of every request job ``job_id`` sent, all its runs and packs together.

    Raises :class:`~longctx.errors.SessionNotFound` when the store holds no answer of that job.
    """
    answers = stored_for_job(store, job_id)
    if not answers:
        raise SessionNotFound(
            job_id, f"no session or job with id {job_id!r} in {store.location} (longctx sessions list)"
        )
    branches = {answer.turn.session_id for stored in answers.values() for answer in stored}
    packs = sorted({store.sessions.session(branch).parent_id or branch for branch in branches})
    ids = sorted({*packs, *(child.id for pack in packs for child in store.sessions.children(pack))})
    records = store.sessions.requests(session_ids=ids)
    questions = {
        turn.session_id: turn.question
        for key, turn in store.sessions.answered_under(job_prefix(job_id)).items()
    }
    return build_report(
        records,
        title=f"job {job_id}: {len(answers)} items over {len(packs)} pack sessions",
        questions={r.id: questions[r.session_id] for r in records if r.session_id in questions},
    )


def answer_request(store: Store, session_id: str) -> RequestRecord | None:
    """The request that answered the sibling branch ``session_id`` (its usage, its replica); None if gone."""
    found = [
        record for record in store.sessions.requests(session_ids=[session_id]) if record.purpose != "warm"
    ]
    return found[-1] if found else None
