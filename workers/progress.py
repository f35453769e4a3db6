"""A one-line progress display for headless runs: steps, steps/s, last returns, phase."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Redraws one line on a terminal; elsewhere prints a line every `every_s` seconds."""

    def __init__(
        self, total: int, enabled: bool = True, stream: TextIO | None = None, every_s: float = 0.5
    ):
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s if self.tty else 10.0
        self.fields: dict[str, object] = {"phase": "starting"}
        self._start = self._last_draw = time.monotonic()
        self._rate_mark = (self._start, 0)
        self.rate = 0.0

    def set(self, **fields: object) -> None:
        self.fields.update(fields)

    def show(self, step: int, phase: str | None = None) -> None:
        now = time.monotonic()
        if now - self._rate_mark[0] >= 2.0:
            self.rate = (step - self._rate_mark[1]) / (now - self._rate_mark[0])
            self._rate_mark = (now, step)
        if not self.enabled or (now - self._last_draw < self.every_s and step < self.total):
            return
        self._last_draw = now
        self.stream.write(
            ("\r" if self.tty else "") + self.line(step, phase) + ("" if self.tty else "\n")
        )
        self.stream.flush()

    def line(self, step: int, phase: str | None = None) -> str:
        width = 24
        done = min(step / max(self.total, 1), 1.0)
        bar = "#" * int(done * width) + "-" * (width - int(done * width))
        f = self.fields
        parts = [f"[{bar}] {step}/{self.total} {done:4.0%}", f"{self.rate:6.1f} steps/s"]
        if "episode_return" in f:
            parts.append(f"return {f['episode_return']:.1f}")
        if "eval_return" in f:
            parts.append(f"eval {f['eval_return']:.1f}")
        parts.append(str(phase or f["phase"]))
        return " | ".join(parts).ljust(100)

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
