"""benchmarks/profile_gpu_stage.py, dry run on the CPU: it runs the GPU path with a stand-in
decoder and reports each timed part of the GPU stage (the CUDA box runs it for real)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.image import _pictures as P

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_gpu_stage.py"


def test_the_dry_run_reports_the_gpu_stage_s_parts(tmp_path: Path) -> None:
    P.write_tree(tmp_path, {"a": 12, "b": 12}, size=(120, 90))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run-cpu", "--root", str(tmp_path),
         "--batch-size", "8", "--seconds", "0.5", "--warmup", "1"],
        capture_output=True, text=True, timeout=120, check=True)
    out = done.stdout
    assert "img/s alone, batch 8" in out and "takes gray JPEGs: True" in out
    for part in ("make (all of a batch)", "resample", "decoder calls"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {part} |"))
        assert float(row.split("|")[2]) > 0, row
    assert "pictures a call: mean 8.0" in out
