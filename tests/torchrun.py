"""Running a worker script under real ``torchrun`` (gloo, loopback) for the distributed tests,
and checking that no rank is left running."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def processes_naming(marker: str) -> list[int]:
    """The pids of processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


def torchrun(worker: Path, ranks: int, out: Path, *args: str,
             timeout: float = 120) -> list[dict[str, Any]]:
    """Run ``worker`` on ``ranks`` ranks as ``worker args[0] out args[1:]`` (in ``out``, which
    must exist), and return each rank's ``out/rank<r>.json``, in rank order. Asserts a clean
    exit and that no rank is left running."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    cmd = [str(TORCHRUN), f"--nproc-per-node={ranks}", "--nnodes=1", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", str(worker), *args[:1], str(out), *args[1:]]
    proc = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert processes_naming(str(out)) == []  # no rank left running
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    assert [(r["rank"], r["world"]) for r in results] == [(r, ranks) for r in range(ranks)]
    return results
