"""The API side of the CLI-against-API benchmark: the work of one ``longctx batch``, as a fresh process.

Usage: batch_one.py PATH QUESTIONS_FILE BASE_URL MAX_TOKENS [CACHE_SALT]; the store is
$LONGCTX_HOME. Does what ``longctx batch PATH --questions QUESTIONS_FILE
--base-url BASE_URL --max-tokens MAX_TOKENS`` does, through the public API
(a :class:`longctx.RepoSession` and its ``ask_many``), and prints the same:
each answer under its question on stdout, the report's line on stderr.
"""

from __future__ import annotations

import sys

from longctx import RepoSession, RequestOptions


def main() -> None:
    path, questions_file, base_url, max_tokens = sys.argv[1:5]
    salt = sys.argv[5] if len(sys.argv) > 5 else None
    with open(questions_file, encoding="utf-8") as lines:
        questions = [line.strip() for line in lines if line.strip()]
    request = RequestOptions(max_tokens=int(max_tokens), cache_salt=salt)
    with RepoSession(path, server=base_url, request=request) as session:
        result = session.ask_many(questions, reuse_answered=True)
    for answer in result:
        print(f"## {answer.question}\n\n{answer.text}\n")
    print(f"session {session.id}: {result.report.summary_line()}", file=sys.stderr)


if __name__ == "__main__":
    main()
