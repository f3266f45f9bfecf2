"""The longctx side of the speed benchmark: pack one folder into one file, as a fresh process.

Usage: pack_one.py SOURCE OUTPUT {cl100k,estimate}; the store is $LONGCTX_HOME.
Prints one JSON line: documents, bytes, tokens, seconds per stage.
"""

from __future__ import annotations

import json
import sys
import time

started = time.perf_counter()

from longctx.corpus import load_corpus  # noqa: E402 - imports are part of the measured time
from longctx.packing import build_pack  # noqa: E402
from longctx.store import Store  # noqa: E402
from longctx.tokens import EstimateTokenizer, TiktokenFileTokenizer, Tokenizer  # noqa: E402


def main() -> None:
    source, output, mode = sys.argv[1:4]
    imported = time.perf_counter()
    corpus = load_corpus(source)
    loaded = time.perf_counter()
    tokenizer: Tokenizer = (
        TiktokenFileTokenizer.named("cl100k_base") if mode == "cl100k" else EstimateTokenizer()
    )
    with Store.open() as store:
        pack = build_pack(corpus, tokenizer=tokenizer, store=store)
    packed = time.perf_counter()
    with open(output, "w", encoding="utf-8") as file:
        file.write(pack.system)
        file.writelines(pack.prefix_parts())
    written = time.perf_counter()
    print(
        json.dumps(
            {
                "documents": len(corpus.documents),
                "pack_bytes": sum(section.size_bytes for section in pack.sections),
                "tokens": pack.prefix_tokens,
                "estimated": pack.estimated,
                "import_s": imported - started,
                "load_s": loaded - imported,
                "pack_s": packed - loaded,
                "write_s": written - packed,
            }
        )
    )


if __name__ == "__main__":
    main()
