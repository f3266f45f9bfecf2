"""Answers an application uses, timed over one pack: a streamed follow-up's first piece, and typed batches.

Against one running server (a GPU machine's; or the test suite's CPU servers with small sizes), over a
pack of standard-library text (``followup_probe.fitted_pack``), each row under its own ``cache_salt``:

- ``stream follow-up``: a session over the pack asks once (cold), then ``--follow-ups`` questions
  through :meth:`~longctx.sessions.conversation.Conversation.stream`; the seconds from the call to
  its first piece of text. Once with prompts as token ids, once as chat text.
- ``stream question alone``: the same questions in a session with no pack at all: the floor a cached
  follow-up is held against (the ratio is the row's point).
- ``batch plain`` and ``batch schema``: ``ask_many`` of 8 questions over the pack, cold, with a schema
  (``SCHEMA``, decoded under the engine's constraint), then plain with max_tokens set to the typed
  answers' mean length; ``--repeats`` rounds, wall seconds each.

Writes JSON (``--out``) and prints a summary line per row on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from followup_probe import FOLLOW_UPS, SYSTEM, WINDOW_ROOM, fitted_pack

from longctx.backends.base import connect
from longctx.errors import InvalidAnswer
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.store import Store, StoredPack

#: Bounded strings and an enum: a random-weight model would otherwise fill a free string until max_tokens.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "function": {"type": "string", "maxLength": 24},
        "reason": {"type": "string", "maxLength": 48},
        "confidence": {"enum": [1, 2, 3, 4, 5]},
    },
    "required": ["function", "reason", "confidence"],
    "additionalProperties": False,
}
QUESTIONS = tuple(
    f"Question {n}: which function of these files would you test first, and why?" for n in range(8)
)


#: Body fields every request carries (``--ban-whitespace``: a logit_bias against whitespace-only tokens).
EXTRA: dict[str, Any] = {}


def _request(ids: bool, max_tokens: int) -> RequestOptions:
    return RequestOptions(
        max_tokens=max_tokens, temperature=0.0, cache_salt=uuid.uuid4().hex, prompt_ids=ids, extra_body=EXTRA
    )


def whitespace_ban(tokenizer_json: Path) -> dict[str, Any]:
    """A ``logit_bias`` that bans the tokenizer's whitespace-only tokens.

    A random-weight model under a JSON constraint fills the answer with whitespace until max_tokens
    (measured on both CPU engines); banning those tokens lets it close the JSON. Both batches carry it.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    blank = [i for i in range(tokenizer.get_vocab_size()) if (t := tokenizer.decode([i])) and not t.strip()]
    return {"logit_bias": dict.fromkeys(map(str, blank), -100)}


def stream_rows(
    backend: Any, store: Store, pack: StoredPack | None, follow_ups: int, ids: bool
) -> list[float]:
    """Seconds to the first streamed piece of each follow-up, after one cold question over ``pack``."""
    session = Session(backend, pack, store=store, request=_request(ids, 8))
    session.ask("Hi.")
    firsts = []
    for question in FOLLOW_UPS[:follow_ups]:
        started, first = time.perf_counter(), None
        with session.stream(question) as stream:
            for _ in stream:
                if first is None:
                    first = time.perf_counter() - started
        firsts.append(first if first is not None else float("nan"))
    return firsts


def batch_seconds(
    backend: Any, store: Store, pack: StoredPack, schema: dict[str, Any] | None, max_tokens: int
) -> dict[str, Any]:
    """One cold ``ask_many`` of 8 over ``pack`` (plain, or typed by ``schema``): seconds, and what parsed."""
    session = Session(backend, pack, store=store, request=_request(True, max_tokens))
    started = time.perf_counter()
    try:
        batch = session.ask_many(list(QUESTIONS), **({"schema": schema} if schema else {}))
    except InvalidAnswer as error:  # a random-weight model's JSON cut at max_tokens: timed, not typed
        return {"seconds": time.perf_counter() - started, "typed": None, "invalid": str(error)}
    seconds = time.perf_counter() - started
    typed = sum(answer.data is not None for answer in batch.answers) if schema else None
    cached = [answer.usage.cached_tokens for answer in batch.answers]
    generated = [answer.usage.completion_tokens for answer in batch.answers]
    return {"seconds": seconds, "typed": typed, "cached": cached, "completion_tokens": generated}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--pack", default="100000", help="pack tokens, or max")
    parser.add_argument("--follow-ups", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chars-per-token", type=float, default=3.6)
    parser.add_argument("--home", type=Path, default=Path("/tmp/answers-probe"))
    parser.add_argument("--ban-whitespace", type=Path, help="the served tokenizer.json (see whitespace_ban)")
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    if options.ban_whitespace:
        EXTRA.update(whitespace_ban(options.ban_whitespace))
    with connect(options.base_url) as backend, Store.open(options.home / uuid.uuid4().hex) as store:
        info = backend.info
        window = info.context_length or 32768
        target = window - WINDOW_ROOM if options.pack == "max" else int(options.pack)
        text = fitted_pack(target, backend.tokenizer(), options.chars_per_token)
        pack = StoredPack(uuid.uuid4().hex * 2, "probe/1", SYSTEM, text, {})
        results: dict[str, Any] = {"engine": info.engine, "version": info.version, "model": info.model,
                                   "pack_target": target, "rows": {}}  # fmt: skip
        rows = results["rows"]
        rows["stream follow-up ids"] = stream_rows(backend, store, pack, options.follow_ups, ids=True)
        rows["stream follow-up text"] = stream_rows(backend, store, pack, options.follow_ups, ids=False)
        rows["stream question alone"] = stream_rows(backend, store, None, options.follow_ups, ids=True)
        for name in ("stream follow-up ids", "stream follow-up text", "stream question alone"):
            print(
                f"[answers] {name}: median {statistics.median(rows[name]):.3f} s", file=sys.stderr, flush=True
            )
        for round_ in range(options.repeats):
            # The typed batch first; the plain one then generates as many tokens as it did (a random model
            # rarely stops by itself), so the two differ by the constraint, not by the answers' length.
            typed = batch_seconds(backend, store, pack, SCHEMA, 96)
            length = round(statistics.mean(typed.get("completion_tokens") or [96]))
            rows.setdefault("batch schema", []).append(typed)
            rows.setdefault("batch plain", []).append(batch_seconds(backend, store, pack, None, length))
            print(f"[answers] batch round {round_}: {rows['batch plain'][-1]['seconds']:.2f} s plain, "
                  f"{rows['batch schema'][-1]['seconds']:.2f} s schema "
                  f"({rows['batch schema'][-1]['typed']}/8 typed)", file=sys.stderr, flush=True)  # fmt: skip
        options.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
