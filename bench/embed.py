"""Embedder speed: load time, texts/s one at a time and 64 per call, peak RSS (LoCoMo turns as texts).

.venv/bin/python bench/embed.py [--data LOCOMO.json] [--n 512]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from locomo_data import DEFAULT_DATA, load_conversations

import solos_embed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo JSON (default: %(default)s)")
    parser.add_argument("--n", type=int, default=512, help="texts per measurement (default: %(default)s)")
    args = parser.parse_args(argv)
    texts = [f"{t.speaker} ({t.date}): {t.fact}" for c in load_conversations(Path(args.data)) for t in c.turns]
    texts = texts[: args.n]
    print(f"{len(texts)} LoCoMo turns, mean {sum(map(len, texts)) / len(texts):.0f} characters")

    started = time.perf_counter()
    embedder = solos_embed.load_embedder(None)
    print(f"load (imports, sha256, session): {time.perf_counter() - started:.2f} s  model {embedder.model_id}")
    embedder.embed(texts[:8])
    started = time.perf_counter()
    for text in texts:
        embedder.embed([text])
    single = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(0, len(texts), 64):
        embedder.embed(texts[i : i + 64])
    batched = time.perf_counter() - started
    print(f"embed([text]): {len(texts) / single:.0f} texts/s ({1000 * single / len(texts):.1f} ms each)")
    print(f"embed(64 texts): {len(texts) / batched:.0f} texts/s")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
