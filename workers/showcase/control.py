"""The showcase: one player process that plays the run's newest weights into shared memory.

A run (owning or attached) has one, `run.showcase`. Its controls (camera, weights source,
episode reset) are shared values, so a change applies within one player step, also to a player
started later.
The player itself is player.py; this is the run's side of it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import numbers
from collections.abc import Callable
from pathlib import Path

from agent.agent import resolve_device
from agent.config import Config
from agent.errors import ConfigError, UserError
from workers.host.signals import children_ignore_ctrl_c
from workers.rundir.replays import KINDS
from workers.showcase.episodes import LAYOUTS, find_entry
from workers.showcase.frames import FrameBuffer
from workers.showcase.player import PlayerSpec, ShowcaseControls, player_main, task_cameras
from workers.showcase.replay import MODES

DEFAULT_SHARE = 0.07  # showcase CPU budget (cores) when training on the CPU


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class Showcase:
    def __init__(
        self,
        ctx: mp.context.BaseContext,
        path: Path,
        cfg: Config,
        resting: object,
        sources: Callable[[], tuple[int, int]],
    ):
        """`resting` (an Event): set while no worker trains, the player then has no CPU cap;
        `sources()`: the run's (workers, race lanes) now, whose weights it may play."""
        self._ctx, self.path, self.cfg, self._sources = ctx, path, cfg, sources
        self._player: mp.Process | None = None
        self._frames: FrameBuffer | None = None
        self._render_paused, self._player_stop = ctx.Event(), ctx.Event()
        self._controls = ShowcaseControls(
            ctx.Value("i", 0),
            ctx.Value("i", -1),
            ctx.Event(),
            resting,
            ctx.Value("i", 0),
            pin=ctx.Array("q", [-1, 0, 0]),
            panes=ctx.Value("i", 0),
        )
        self._camera_names: list[str] | None = None

    def pids(self) -> list[int]:
        """The player's process id while it runs."""
        alive = self._player is not None and self._player.is_alive()
        return [self._player.pid] if alive else []

    def start(
        self,
        height: int = 240,
        width: int = 320,
        realtime: bool = True,
        max_fps: float = 30.0,
        cpu_share: float | None = None,
    ) -> None:
        """Start the player, rendering frames of the size the reader asks for.

        `cpu_share` caps its CPU time (cores); by default 0.07 when the workers train on the
        CPU (it then plays in slow motion rather than slow them) and no cap with a GPU."""
        if cpu_share is None:
            cpu_share = 0.0 if resolve_device(self.cfg.device).type == "cuda" else DEFAULT_SHARE
        if self._player is not None and self._player.is_alive():
            raise UserError("the showcase player is already running")
        if not (16 <= height <= 2160 and 16 <= width <= 3840):
            raise ConfigError(
                f"frame size must be within 16x16 and 3840x2160, got {width}x{height}"
            )
        if self._frames is not None:
            self._frames.close(unlink=True)
        self._frames = FrameBuffer(height, width)
        self._player_stop.clear()
        self._controls.reset.clear()  # a reset asked for while no player ran is void
        spec = PlayerSpec(
            str(self.path),
            dataclasses.asdict(self.cfg),
            self._frames.name,
            height,
            width,
            realtime,
            max_fps=max_fps,
            cpu_share=cpu_share,
        )
        self._player = self._ctx.Process(
            target=player_main,
            args=(spec, self._render_paused, self._player_stop, self._controls),
            name="tdmpc2-showcase",
            daemon=True,
        )
        with children_ignore_ctrl_c():
            self._player.start()

    def camera_names(self) -> list[str]:
        """The task's cameras in id order; -1, MuJoCo's free camera, is not listed."""
        if self._camera_names is None:
            self._camera_names = task_cameras(self.cfg)
        return list(self._camera_names)

    def choose(
        self, camera: int | None = None, source: int | None = None, mode: str | None = None
    ) -> None:
        """Choose the camera (an id of camera_names(), or -1: MuJoCo's free camera), the
        weights played (-1: merged, k: worker k's newest, -2 - L: race lane L's merged) and the
        mode: "live" (the planner acting with those weights), "replay" (their newest finished
        episode again at 1x) or "auto" (replay on a CPU where live play is under half real
        speed; replay.py). Applies within one player step, also to a player started later; an
        out-of-range value changes nothing (ConfigError)."""
        if mode is not None and mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if camera is not None:
            last = len(self.camera_names()) - 1
            if not is_int(camera) or not -1 <= camera <= last:
                raise ConfigError(
                    f"camera must be in [-1, {last}] (-1: the free camera; the cameras of "
                    f"{self.cfg.task}: {', '.join(self.camera_names()) or 'none'}), got {camera!r}"
                )
        if source is not None:
            workers, lanes = self._sources()
            last = workers - 1
            if not is_int(source) or not -1 - lanes <= source <= last:
                lane = f", or -2 - L for lane L < {lanes}'s merged weights" if lanes else ""
                raise ConfigError(
                    f"source must be -1 (merged weights) or a worker in [0, {last}]{lane}, got "
                    f"{source!r}"
                )
        if camera is not None:
            self._controls.camera.value = int(camera)
        if source is not None:
            if source != self._controls.source.value:
                self.pin(None)  # the timeline is the shown source's: a pin of another ends
            self._controls.source.value = int(source)
        if mode is not None:
            self._controls.mode.value = MODES.index(mode)

    def pin(self, worker: int | None, kind: str = "train", step: int = 0) -> None:
        """Replay album episode (worker, kind, step) at 1x, again and again, in place of the
        newest (None: the newest again). One the album does not hold is refused (UserError)
        and changes nothing."""
        if worker is None:
            values = [-1, 0, 0]
        else:
            if kind not in KINDS:
                raise ConfigError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
            if not is_int(worker) or not is_int(step) or worker < 0 or step < 0:
                raise ConfigError(
                    f"an album episode is a worker >= 0 and a step >= 0, got {worker!r}, {step!r}"
                )
            if find_entry(self.path, worker, kind, step) is None:
                raise UserError(
                    f"the album holds no {kind} episode of worker {worker} ending at step "
                    f"{step:,} (never kept, or thinned out since)"
                )
            values = [int(worker), KINDS.index(kind), int(step)]
        with self._controls.pin.get_lock():
            self._controls.pin[:] = values

    def show_panes(self, layout: str) -> None:
        """Split the viewport: "single" (one view), "then-now-2" / "then-now-4" (the shown
        source's first and newest album episodes, and the thirds between), "lanes" (each race
        lane's newest episode), "agent-view" (a pixel agent's frames beside the one view).
        Refused (UserError) with a reason, changing nothing."""
        if layout not in LAYOUTS:
            raise ConfigError(f"panes must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if layout == "agent-view" and self.cfg.obs != "rgb":
            raise UserError(
                "the agent's view shows the frames a run from pixels learns from (--obs rgb); "
                "this run's agent sees the task's state"
            )
        if layout == "lanes" and self._sources()[1] < 2:
            raise UserError("panes by lane need a race of 2 lanes or more: start a race first")
        self._controls.panes.value = LAYOUTS.index(layout)

    def settings(self) -> dict:
        """The camera, source and mode the showcase uses now (or will, once started), the
        album episode pinned and the panes: {"camera": id, "source": number, "mode": "auto" |
        "live" | "replay", "pin": (worker, kind, step) or None, "panes": a LAYOUTS name}."""
        controls = self._controls
        with controls.pin.get_lock():
            worker, kind, step = controls.pin[:]
        return {
            "camera": controls.camera.value,
            "source": controls.source.value,
            "mode": MODES[controls.mode.value],
            "pin": (worker, KINDS[kind], step) if worker >= 0 else None,
            "panes": LAYOUTS[controls.panes.value],
        }

    def reset(self) -> None:
        """End the showcase episode at once and start a new one."""
        self._controls.reset.set()

    def pause_rendering(self, paused: bool = True) -> None:
        (self._render_paused.set if paused else self._render_paused.clear)()

    def read_frame(self):
        """(frame HxWx3 uint8, info) of the newest complete frame, or None."""
        return self._frames.read() if self._frames is not None else None

    def frame_sequence(self) -> int:
        """The frames' sequence counter (see FrameBuffer.sequence); 0 before any."""
        return self._frames.sequence() if self._frames is not None else 0

    def stop(self) -> None:
        if self._player is not None:
            self._player_stop.set()
            self._player.join(30)
            if self._player.is_alive():
                self._player.kill()
            self._player = None
        if self._frames is not None:
            self._frames.close(unlink=True)
            self._frames = None
