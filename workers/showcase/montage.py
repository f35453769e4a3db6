"""A learning montage rendered to an MP4: the planned album episodes (montage_plan.py) replayed
from their poses at 1x, one after another in step order, each with its step, its return and
the learning curve drawn on it (montage_draw.py), a race's lanes side by side; a run from
pixels with the agent's frames beside each (agent_view.py).

The file appears whole or not at all: frames go to a temporary file in the same folder, which
replaces the target only once it is complete, and is removed on any error or interruption. What
the writer raises, whatever its type, is that writing failed: one line (UserError).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
from PIL import Image

from agent.envs import env_of
from agent.errors import UserError
from workers.rundir.replays import EpisodeReplay
from workers.showcase.agent_view import PoseFrames, pose_frame, view_width
from workers.showcase.agent_view import compose as beside
from workers.showcase.montage_draw import chart_scale, compose, grid, tile_overlay
from workers.showcase.montage_plan import KIND_WORDS, MontagePlan
from workers.showcase.player import light_rendering

FPS = 30
HOLD_S = 0.5  # the last pose stays this long, so the final return can be read
SIZE = (480, 640)  # (height, width) of the montage of one worker
RACE_SIZE = (360, 480)  # of each lane's tile in a race


def default_size(plan: MontagePlan) -> tuple[int, int]:
    return SIZE if len(plan.tiles) == 1 else RACE_SIZE


def pose_index(frame: int, replay: EpisodeReplay, fps: float) -> int:
    """The pose shown at frame `frame` of an episode at 1x (the last one once it is over)."""
    return min(int(frame / fps / replay.step_seconds + 1e-9), replay.length)


def segment_frames(replays: list[EpisodeReplay], fps: float, hold_s: float = HOLD_S) -> int:
    """Frames of one episode of the montage: the longest tile's episode at 1x, its last pose
    included, then the hold."""
    longest = max(math.floor(r.length * r.step_seconds * fps + 1e-9) + 1 for r in replays)
    return longest + round(hold_s * fps)


def total_frames(plan: MontagePlan, fps: float = FPS) -> int:
    return sum(
        segment_frames([t.episodes[n] for t in plan.tiles], fps) for n in range(plan.episodes)
    )


def _open_target(out: Path) -> Path:
    """The temporary file beside `out`, created now: a target that cannot be written is found
    before any rendering (UserError)."""
    if out.suffix.lower() != ".mp4":
        raise UserError(f"the montage is an MP4 file: {out} should end in .mp4")
    if not out.parent.is_dir():
        raise UserError(f"cannot write {out}: folder {out.parent} does not exist")
    if out.is_dir():
        raise UserError(f"cannot write {out}: it is a folder")
    temp = out.with_name(f".{out.stem}.{os.getpid()}.partial.mp4")  # .mp4: ffmpeg's format
    try:
        temp.touch()
    except OSError as err:
        raise UserError(f"cannot write {out}: {err.strerror or err}") from None
    return temp


def render_montage(
    plan: MontagePlan,
    out: str | Path,
    size: tuple[int, int] | None = None,
    fps: float = FPS,
    progress: Callable[[int, int], None] | None = None,
    stop: Callable[[], bool] | None = None,
    agent_view: bool | None = None,
) -> Path:
    """Write the montage to `out` (.mp4); each tile is `size` (height, width). `progress` gets
    (frames done, frames in all) after each frame; `stop` returning True ends it as Ctrl+C
    does (KeyboardInterrupt), leaving no file behind. `agent_view`: the agent's frames beside
    each tile (None: when the run learns from pixels; refused for a run from states)."""
    out = Path(out)
    pixels = plan.cfg.obs == "rgb"
    if agent_view and not pixels:
        raise UserError(
            "--agent-view shows the frames a run from pixels learns from: this run's agent "
            "sees states"
        )
    temp = _open_target(out)
    try:
        view = pixels if agent_view is None else agent_view
        _render(plan, temp, size or default_size(plan), fps, progress, stop, view)
        os.replace(temp, out)
    except (OSError, VideoError) as err:  # the disk filled, ffmpeg failed: said in one line
        temp.unlink(missing_ok=True)
        first = str(err).strip().splitlines()  # ffmpeg's errors go on with its command, stderr
        raise UserError(f"writing {out} failed: {first[0] if first else repr(err)}") from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return out


def _render(plan: MontagePlan, path: Path, size, fps, progress, stop, agent_view) -> None:
    height, width = size
    env = env_of(plan.cfg, plan.cfg.seed, render_size=(height, width))
    light_rendering(env)
    try:
        pose = env.physics_state() if env.renders else None
        for tile in plan.tiles:
            if pose is None or any(ep.states.shape[1] != len(pose) for ep in tile.episodes):
                raise UserError(
                    f"the album's poses do not fit {plan.cfg.task}'s model: cannot replay them"
                )
        writer = _Video(path, fps)
        try:
            _write_frames(plan, env, writer, size, fps, progress, stop, agent_view)
            writer.close()  # ffmpeg finishes the file; its error, if any, is the montage's
        finally:
            # On an error too (imageio's `with` leaves it open): ffmpeg must have ended before
            # the caller removes the file, or it writes the file again after.
            with contextlib.suppress(Exception):
                writer.close()
    finally:
        with contextlib.suppress(Exception):  # closing must not hide the error that ended it
            env.close()


class VideoError(Exception):
    """An error of imageio's or ffmpeg's other than OSError: imageio-ffmpeg raises RuntimeError
    (no ffmpeg, ffmpeg ended), imageio ValueError (no FFMPEG plugin, frames it refuses)."""


@contextlib.contextmanager
def _video_errors() -> Iterator[None]:
    try:
        yield
    except (OSError, VideoError):
        raise
    except Exception as err:
        raise VideoError(str(err) or type(err).__name__) from err


class _Video:
    """imageio's FFMPEG writer, whose errors are OSError or VideoError."""

    def __init__(self, path: Path, fps: float):
        with _video_errors():
            self._writer = imageio.get_writer(
                path, format="FFMPEG", fps=fps, codec="libx264", macro_block_size=2, quality=7
            )

    def append_data(self, frame) -> None:
        with _video_errors():
            self._writer.append_data(frame)

    def close(self) -> None:
        with _video_errors():
            self._writer.close()


def _write_frames(plan: MontagePlan, env, writer, size, fps, progress, stop, agent_view) -> None:
    """Each episode's frames at 1x: every tile's pose of the moment (and the agent's frames
    of it), under its overlay."""
    layout, total, done = grid(len(plan.tiles)), total_frames(plan, fps), 0
    # One scale for every tile's chart: the episodes' own returns count too (a curve can miss
    # them: records and album are written apart).
    marks = tuple((ep.step, ep.ret) for t in plan.tiles for ep in t.episodes)
    scale = chart_scale([t.curve for t in plan.tiles] + [marks])
    for n in range(plan.episodes):
        replays = [t.episodes[n] for t in plan.tiles]
        # The text and chart over the view only, the agent's column left clear.
        shown = (size[0], view_width(*size)) if agent_view else size
        layers = [
            _widened(
                tile_overlay(shown, _lines(plan, t.label, r, n), t.curve, (r.step, r.ret), scale),
                size,
            )
            for t, r in zip(plan.tiles, replays)
        ]
        seen = [
            PoseFrames(r.states, partial(pose_frame, env)) if agent_view else None for r in replays
        ]
        for frame in range(segment_frames(replays, fps)):
            if stop is not None and stop():
                raise KeyboardInterrupt
            shots = []
            for replay, poses in zip(replays, seen):
                index = pose_index(frame, replay, fps)
                frames = None if poses is None else poses.at(index)  # moves the env
                env.show_state(replay.states[index])
                shots.append(_shot(env, size, frames))
            writer.append_data(compose(shots, layers, layout))
            done += 1
            if progress is not None:
                progress(done, total)


def _widened(layer: Image.Image, size: tuple[int, int]) -> Image.Image:
    """A see-through layer of `size` (height, width) with `layer` at its left."""
    if layer.size == (size[1], size[0]):
        return layer
    whole = Image.new("RGBA", (size[1], size[0]), (0, 0, 0, 0))
    whole.paste(layer, (0, 0))
    return whole


def _shot(env, size: tuple[int, int], frames: np.ndarray | None) -> np.ndarray:
    """The env's view of its pose (size (height, width)), with `frames` beside it if any."""
    if frames is None:
        return env.render(camera_id=0)
    height, width = size
    env.render_size = (height, view_width(height, width))
    try:
        return beside(env.render(camera_id=0), frames, height, width)
    finally:
        env.render_size = size


def _lines(plan: MontagePlan, label: str, replay: EpisodeReplay, n: int) -> list[str]:
    kind = KIND_WORDS[plan.kind]
    return [
        f"step {replay.step:,}    return {replay.ret:,.1f}",
        f"{label}, {kind} episode {n + 1} of {plan.episodes}",
    ]
