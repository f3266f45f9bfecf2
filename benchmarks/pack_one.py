"""The longctx side of the speed benchmark: pack one folder into one file, as a fresh process.

Usage: pack_one.py SOURCE OUTPUT {cl100k,estimate}; the store is $LONGCTX_HOME.
Goes through longctx.packing.pack, the call the ``longctx pack`` command makes.
Prints one JSON line: documents, bytes, tokens, whether the stored pack was
reused, whether OUTPUT already held the pack (then compared and left as it
was, see longctx.outputs), seconds per stage, and the peak resident memory of this process and
of the largest child it waited for (a counting worker), in bytes.
"""

from __future__ import annotations

import json
import resource
import sys
import time

started = time.perf_counter()

from longctx.packing import pack  # noqa: E402 - imports are part of the measured time
from longctx.store import Store  # noqa: E402
from longctx.tokens.tokenizers import EstimateTokenizer, TiktokenFileTokenizer, Tokenizer  # noqa: E402


def main() -> None:
    source, output, mode = sys.argv[1:4]
    imported = time.perf_counter()
    tokenizer: Tokenizer = (
        TiktokenFileTokenizer.named("cl100k_base") if mode == "cl100k" else EstimateTokenizer()
    )
    with Store.open() as store:
        result = pack(source, tokenizer=tokenizer, store=store)
    packed = time.perf_counter()
    built = result.pack
    saved = built.save(output)  # as `longctx pack -o OUTPUT` saves
    written = time.perf_counter()
    print(
        json.dumps(
            {
                "documents": len(built.documents),
                "pack_bytes": saved.size,
                "output_unchanged": saved.unchanged,
                "tokens": built.prefix_tokens,
                "estimated": built.estimated,
                "reused": result.reused,
                "import_s": imported - started,
                "pack_s": packed - imported,
                "write_s": written - packed,
                "self_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "children_peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
