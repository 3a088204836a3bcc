"""Medians and paired ratios of the lines ``speed.sh`` / ``speed15.sh`` print.

Usage: ``python summarize.py speed-1epoch.txt speed-gil15-2epochs.txt``
"""

from __future__ import annotations

import collections
import json
import statistics
import sys

PAIRS = [("gil folder ms=15", "gil folder-kernel ms=15"),
         ("gil folder ms=0", "gil folder-kernel ms=0"),
         ("images asyncflow", "images asyncflow-kernel")]


def main(paths: list[str]) -> None:
    rates: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    for path in paths:
        with open(path) as fh:
            for line in fh:
                if not line.startswith(("gil", "images")):
                    continue
                words = line.split(" ")
                key = " ".join(words[:3] if words[0] == "gil" else words[:2])
                result = json.loads(line[line.index("{"):])
                rates[key].append(result["img_per_s"])
                cpu[key].append(result["cpu_ms_per_img"])
    for key, runs in rates.items():
        print(f"{key:30s} img/s median {statistics.median(runs):6.0f} "
              f"runs {', '.join(f'{r:.0f}' for r in runs)} "
              f"| CPU ms/img median {statistics.median(cpu[key]):.3f}")
    for new, old in PAIRS:
        if new not in rates or old not in rates:
            continue
        paired = [a / b for a, b in zip(rates[new], rates[old], strict=True)]
        medians = statistics.median(rates[new]) / statistics.median(rates[old])
        print(f"{new:24s} new/old: medians {medians:.3f}, "
              f"paired median {statistics.median(paired):.3f} "
              f"({', '.join(f'{p:.2f}' for p in paired)}), "
              f"CPU/img {statistics.median(cpu[new]) / statistics.median(cpu[old]):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
