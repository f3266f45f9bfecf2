#!/usr/bin/env bash
# A cited answer from the command line: the model ends its answer with the places it rests on,
# and longctx checks each one against the pack before printing it.
#
#   examples/cited_answer.sh [PATH] [QUESTION]
#
# Needs a server (LONGCTX_BASE_URL, or --base-url): see docs/cli.md. The pack and the server's
# cached prefix are the same as for a plain question: the instruction to cite goes after the
# question, so asking again with --cite reads the whole pack from the cache.
set -euo pipefail

path="${1:-.}"
question="${2:-Where does a session decide which replica a request goes to?}"

# The answer, then one line per citation: [ok], or [UNVERIFIED: why]. On a terminal each
# location is a link (OSC 8) to the file; piped, it is plain text.
longctx ask "$path" "$question" --cite

# The shape of what it prints: the answer is an illustration; the lines after it are what longctx
# prints for it (checked with longctx.citations.read_citations against this repository's files):
#
#   Requests for one pack go to one replica: the affinity key is derived from the pack's
#   fingerprint, and with a plain list of URLs longctx orders them by rendezvous hash.
#
#   Sources:
#   - longctx/sessions/session.py:74-75 "def affinity_key(fingerprint: str | None, session_id: str) -> str:"
#   - longctx/backends/base.py "def rendezvous_order("
#   - longctx/routing.py:10-20
#
#   [citations: 2 of 3 verified against the pack]
#     longctx/sessions/session.py:74-75 "def affinity_key(fingerprint: str | None, session_id: str) -> str:"  [ok]
#     longctx/backends/base.py:170 "def rendezvous_order("  [ok]
#     longctx/routing.py:10-20  [UNVERIFIED: no document 'longctx/routing.py' in the pack]
#
# A quote given without lines is placed where it is (the second line); a path the pack does not
# hold is kept and marked. For scripts, --json holds them under "citations":
longctx ask "$path" "$question" --cite --json --quiet \
  | python3 -c 'import json, sys; [print(c["verified"], c["path"], c["start_line"], c["end_line"], c["reason"]) for c in json.load(sys.stdin)["citations"]]'

# The stored session keeps them: `longctx report ID --html report.html` lists each cited answer's
# sources, linked to the files.
