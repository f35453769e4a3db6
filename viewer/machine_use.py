"""The machine's load, shown in the window's status line: CPU use of the whole machine and the
GPU's use and memory.

Sampled at most every 2 s (a sample runs nvidia-smi), on the controller thread, so the frame
loop never waits for it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


class MachineUse:
    """CPU use of the whole machine (from /proc/stat) and GPU use (nvidia-smi), sampled slowly."""

    def __init__(self) -> None:
        self._cpu_prev: tuple[int, int] | None = None
        self._text, self._next = "", 0.0
        self._nvidia_smi = shutil.which("nvidia-smi")

    def text(self) -> str:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + 2.0
            parts = [f"CPU {self._cpu():.0f}% of {os.cpu_count()} cores"]
            gpu = self._gpu()
            if gpu:
                parts.append(gpu)
            self._text = "  |  ".join(parts)
        return self._text

    def _cpu(self) -> float:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return 0.0
        idle, total = fields[3] + fields[4], sum(fields)
        prev, self._cpu_prev = self._cpu_prev, (idle, total)
        if prev is None or total == prev[1]:
            return 0.0
        return 100.0 * (1.0 - (idle - prev[0]) / (total - prev[1]))

    def _gpu(self) -> str:
        if not self._nvidia_smi:
            return ""
        try:
            out = subprocess.run(
                [
                    self._nvidia_smi,
                    "--query-gpu=utilization.gpu,memory.used,memory.total",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=2,
            ).stdout.split("\n")[0]
            util, used, total = (float(v) for v in out.split(","))
        except (OSError, ValueError, subprocess.SubprocessError):
            return ""
        return f"GPU {util:.0f}%, {used / 1024:.1f} / {total / 1024:.0f} GiB"
