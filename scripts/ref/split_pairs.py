#!/usr/bin/env python3
"""Extract (cloud, edge) prompt pairs from ShareGPT for the split-exactness tests.

Writes tests/fixtures/split_pairs.json: each pair is a public "cloud" system prompt (a
ShareGPT assistant answer, 600-2000 characters) and a private "edge" user message (a
ShareGPT human turn from another conversation, 80-800 characters). Seeded, reproducible.
Usage: python3 scripts/ref/split_pairs.py [N]   (needs models/ShareGPT...json: scripts/models.py sharegpt)
"""
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "models" / "ShareGPT_V3_unfiltered_cleaned_split.json"


def records(path, limit=4000):
    """Parse the (truncated) JSON array record by record."""
    text = path.read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out = []
    while len(out) < limit:
        while i < len(text) and text[i] in " \r\n\t,":
            i += 1
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        out.append(rec)
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    recs = records(SRC)
    rng = random.Random(2024)
    clouds, edges = [], []
    for r in recs:
        for turn in r.get("conversations", []):
            v = turn.get("value", "").strip()
            if turn.get("from") == "gpt" and 600 <= len(v) <= 2000 and v.isascii():
                clouds.append(v)
            if turn.get("from") == "human" and 80 <= len(v) <= 800 and v.isascii():
                edges.append(v)
    rng.shuffle(clouds)
    rng.shuffle(edges)
    pairs = [{"cloud": c, "edge": e} for c, e in zip(clouds[:n], edges[:n])]
    out = ROOT / "tests" / "fixtures" / "split_pairs.json"
    out.write_text(json.dumps({"source": SRC.name, "seed": 2024, "pairs": pairs}, indent=1))
    print(f"wrote {len(pairs)} pairs to {out}")


if __name__ == "__main__":
    main()
