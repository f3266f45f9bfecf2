"""Jobs: many packs and many questions, scheduled for the cache; a layer above the sessions.

- :mod:`~longctx.jobs.job`: :class:`Job` (the items of one run), its
  options, progress and results: each pack's questions go out as siblings
  of one session, packs are spread over the replicas and bounded by their
  KV caches, and a run after a crash asks only what has no answer yet;
- :mod:`~longctx.jobs.items`: :class:`JobItem` (one question about one
  pack, its answer optionally typed by a schema), read from JSONL by
  :func:`read_job` or made in Python;
- :mod:`~longctx.jobs.keys`: what a job's stored answer is keyed by (the
  pack's fingerprint, the model, the server, the options that shape it),
  and why an item is asked again;
- :mod:`~longctx.jobs.residency`: where a pack's KV probably is now (GPU,
  host tier, gone), so a job visits the cheapest packs first;
- :mod:`~longctx.jobs.stored`: a job as the store keeps it: its report by
  the id the job printed, whether a session is one of a job's, what a
  reused answer cost and where;
- :mod:`~longctx.jobs.room`: the KV tokens each replica has left for the
  packs in flight;
- :mod:`~longctx.jobs.ownership`: one owner per item, so two runs of one
  job at once never ask an item twice (leases in the store).
"""

from __future__ import annotations

from longctx.jobs.items import JobItem, read_job
from longctx.jobs.job import Job, JobOptions, JobProgress, JobReport, JobResult
from longctx.jobs.stored import job_of_session, job_report

__all__ = [
    "Job",
    "JobItem",
    "JobOptions",
    "JobProgress",
    "JobReport",
    "JobResult",
    "job_of_session",
    "job_report",
    "read_job",
]
