"""The progress display of headless runs, on tqdm: agent steps, elapsed and remaining time,
steps/s, the phase (seeding, pretraining k/N updates, training, evaluating j/N episodes, saving)
and the last episode and evaluation returns; for a multi-worker run the total over the workers
and each worker's state and return.

On a terminal the bar redraws in place; elsewhere (a log file, a pipe) a plain line is printed
every `every_s` seconds (10 by default), so that logs stay readable.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

from tqdm import tqdm

from agent.errors import printable

BAR_FORMAT = (
    "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
)
UNITS = {"pretraining": "updates", "evaluating": "episodes"}
RATE_WINDOW_S = 2.0  # steps/s is measured over at least this long


def phase_text(phase: str, done: int | None = None, total: int | None = None) -> str:
    """ "pretraining 150/1000 updates", "evaluating 2/10 episodes", "training", ..."""
    if done is None or total is None:
        return phase
    return f"{phase} {done}/{total} {UNITS.get(phase, '')}".rstrip()


def status_text(phase: str, fields: dict[str, float]) -> str:
    """The part after the rate: phase, then the last episode and evaluation returns."""
    parts = [phase]
    if "update_rate" in fields:
        parts[0] += f" ({fields['update_rate']:.1f} updates/s)"
    if "episode_return" in fields:
        parts.append(f"return {fields['episode_return']:.1f}")
    if "eval_return" in fields:
        parts.append(f"eval {fields['eval_return']:.1f}")
    return " | ".join(parts)


def worker_text(row: dict, pretrain_updates: int) -> str:
    """One worker in the multi-worker line: "w0 training 512.3", "w1 pretraining 150/1000"."""
    state = str(row["state"])
    text = f"w{row['worker']} {state}"
    if state == "pretraining":
        text += f" {int(row.get('updates', 0))}/{pretrain_updates}"
    ret = row.get("last_return", math.nan)
    if state != "starting" and isinstance(ret, (int, float)) and math.isfinite(ret):
        text += f" {ret:.1f}"
    return text


class _Rate:
    """Steps per second over the last RATE_WINDOW_S or more."""

    def __init__(self) -> None:
        self.value = 0.0
        self._mark: tuple[float, float] | None = None

    def see(self, count: float, now: float) -> None:
        if self._mark is None or count < self._mark[1]:
            self._mark = (now, count)
        elif now - self._mark[0] >= RATE_WINDOW_S:
            self.value = (count - self._mark[1]) / (now - self._mark[0])
            self._mark = (now, count)


class _Bar(tqdm):
    """tqdm showing our windowed rate (a run's pauses for pretraining and evaluation would
    otherwise skew tqdm's own estimate); None: tqdm's average since the start."""

    shown_rate: float | None = None

    @property
    def format_dict(self) -> dict:
        values = super().format_dict
        if self.shown_rate:
            values["rate"] = self.shown_rate
        return values


class _Discard:
    """Where tqdm writes when we print the lines ourselves (not a terminal)."""

    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class _Display:
    """One tqdm bar: drawn in place on a terminal, else printed as a line every `every_s`."""

    def __init__(self, total: int, stream: TextIO | None, tty: bool | None, every_s: float | None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = every_s if every_s is not None else (0.5 if self.tty else 10.0)
        self.bar = _Bar(
            total=total,
            file=self.stream if self.tty else _Discard(),
            unit="step",
            bar_format=BAR_FORMAT,
            dynamic_ncols=self.tty,
            ascii=not self.tty,
            mininterval=math.inf,  # drawn when we say (see draw), not by tqdm on its own
            leave=True,
        )
        self._last_draw = -math.inf
        self._last_shown: tuple[int, str] | None = None

    def draw(self, count: int, rate: float | None, status: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < self.every_s:
            return
        if force and not self.tty and self._last_shown == (count, status):
            return  # a final line that says nothing new
        self._last_draw, self._last_shown = now, (count, status)
        self.bar.n = min(count, self.bar.total) if self.bar.total else count
        self.bar.shown_rate = rate
        self.bar.set_postfix_str(status, refresh=False)
        if self.tty:
            self.bar.refresh()
        else:
            self.stream.write(str(self.bar) + "\n")
            self.stream.flush()

    def write(self, text: str) -> None:
        # Lines may quote records of a run directory someone else made: no escape sequence
        # reaches the terminal.
        text = "\n".join(printable(line, 2000) for line in text.split("\n"))
        if self.tty:
            self.bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.bar.close()  # leaves the last bar on screen
        else:
            self.bar.disable = True  # nothing more to write (close would write to _Discard)


class Progress:
    """Progress of one training process. `rate` (agent steps/s) is kept even when the display
    is off (workers report it)."""

    def __init__(
        self,
        total: int,
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float | None = None,
        tty: bool | None = None,
    ):
        self.total, self.enabled = total, enabled
        self.fields: dict[str, float] = {}
        self.phase_name, self.phase_done, self.phase_total = "starting", None, None
        self._steps = _Rate()
        self._updates = _Rate()
        self._step = 0
        self._display = _Display(total, stream, tty, every_s) if enabled else None

    @property
    def rate(self) -> float:
        return self._steps.value

    def set(self, **fields: float) -> None:
        """Record values shown from now on (episode_return, eval_return)."""
        self.fields.update(fields)

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """Enter (or advance) a phase; `done` of `total` updates or episodes where it has some."""
        if name != self.phase_name:
            self.fields.pop("update_rate", None)
        self.phase_name, self.phase_done, self.phase_total = name, done, total
        if name == "pretraining" and done is not None:
            self._updates.see(done, time.monotonic())
            if self._updates.value:
                self.fields["update_rate"] = self._updates.value

    def line(self) -> str:
        """The status after the rate: phase and returns."""
        phase = phase_text(self.phase_name, self.phase_done, self.phase_total)
        return status_text(phase, self.fields)

    def show(self, step: int | None = None, force: bool = False) -> None:
        """Note the agent step reached; redraw if due (or `force`)."""
        if step is not None:
            self._step = step
        self._steps.see(self._step, time.monotonic())
        if self._display is not None:
            # Steps/s says nothing while steps do not advance: tqdm's average then.
            rate = self.rate if self.phase_name in ("seeding", "training") else None
            self._display.draw(self._step, rate, self.line(), force)

    def write(self, text: str) -> None:
        """A message line that does not break the bar."""
        if self._display is not None:
            self._display.write(text)

    def close(self) -> None:
        if self._display is not None:
            self.show(force=True)
            self._display.close()
            self._display = None


class WorkersProgress:
    """A multi-worker run: one bar of the agent steps of all workers together, with each
    worker's state and last episode return after it."""

    def __init__(
        self,
        steps_per_worker: int,
        pretrain_updates: int,
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float | None = None,
        tty: bool | None = None,
    ):
        self.steps_per_worker, self.pretrain_updates = steps_per_worker, pretrain_updates
        self.stream = stream or sys.stderr
        self._rate = _Rate()
        self._display = _Display(0, stream, tty, every_s) if enabled else None

    def line(self, rows: list[dict]) -> str:
        return ", ".join(worker_text(r, self.pretrain_updates) for r in rows)

    def update(self, rows: list[dict], force: bool = False) -> None:
        counted = [r for r in rows if r["state"] != "removed"]
        steps = int(sum(r["step"] for r in counted))
        self._rate.see(steps, time.monotonic())
        if self._display is None:
            return
        self._display.bar.total = self.steps_per_worker * max(1, len(counted))
        training = any(r["state"] in ("seeding", "training") for r in counted)
        self._display.draw(steps, self._rate.value if training else None, self.line(rows), force)

    def write(self, text: str) -> None:
        if self._display is not None:
            self._display.write(text)
        else:
            print(text, file=self.stream)

    def close(self) -> None:
        if self._display is not None:
            self._display.close()
            self._display = None
