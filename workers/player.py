"""The showcase player: a process that plays a policy of the run and renders it offscreen.

It shows the merged weights (merge/merged.pt; before the first merge worker 0's checkpoint, or
the untrained model) or, when asked, one worker's newest weights, reloading them at each episode
start when the file changed. The camera, the source and an episode reset are shared values the
run changes while the player runs. It acts with the planner in evaluation mode at real-time pace
(or as fast as it can), writes each rendered frame into shared memory and logs each finished
episode's return to player.jsonl. Frames are a latest-wins snapshot guarded by a sequence
counter (odd while a frame is being written), so the reader never waits and never sees half a
frame."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.config import Config
from agent.envs import DMControlEnv
from agent.errors import WeightsError
from workers.paths import (
    PLAYER_LOG,
    checkpoint_path,
    merge_dir,
    merged_path,
    start_path,
    weights_name,
)
from workers.rundir import RunDir, load_state
from workers.signals import child_signals
from workers.threads import SHOWCASE_THREADS, apply_threads

# int64 header slots: sequence, height, width, then the frame info (INFO fields in order), the
# rest reserved so fields can be added without changing the layout of those before them; the
# last slot is the reader's: the sequence of the frame it took last.
HEADER = 16
INFO = ("episode", "step", "weights_round", "return", "camera", "source", "weights_step", "pace")
_INFO_AT = 3  # first info slot
_TAKEN = HEADER - 1
SLOW_CHECK_STEPS = 5  # in slow motion, look for newer weights every this many steps
SLOW_SWITCH_S = 20.0  # ... once an episode has played this long (short ones still finish)


class FrameBuffer:
    """Shared-memory frame of a size chosen by the reader: header + height x width x 3 bytes."""

    def __init__(self, height: int, width: int, name: str | None = None, create: bool = True):
        size = HEADER * 8 + height * width * 3
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=size)
        self.header = np.ndarray((HEADER,), np.int64, self.shm.buf)
        self.pixels = np.ndarray((height, width, 3), np.uint8, self.shm.buf, offset=HEADER * 8)
        if create:
            self.header[:] = 0
            self.header[1:3] = (height, width)
        self.name, self.height, self.width = self.shm.name, height, width

    def write(
        self,
        frame: np.ndarray,
        episode: int,
        step: int,
        weights_round: int,
        ret: float,
        camera: int = 0,
        source: int = -1,
        weights_step: int = -1,
        pace: float = 1.0,
    ) -> None:
        self.header[0] += 1  # odd: writing
        self.pixels[:] = frame
        info = (
            episode,
            step,
            weights_round,
            int(ret * 1000),
            camera,
            source,
            weights_step,
            int(pace * 1000),
        )
        self.header[_INFO_AT : _INFO_AT + len(INFO)] = info
        self.header[0] += 1  # even: complete

    def wanted(self) -> bool:
        """True when the reader has taken the newest frame (or there is none yet): a frame
        rendered now would be shown. The writer renders no more frames than are shown."""
        return int(self.header[_TAKEN]) == int(self.header[0])

    def sequence(self) -> int:
        """Grows with every frame written: a reader can see whether a new one came, cheaply."""
        return int(self.header[0])

    def read(self) -> tuple[np.ndarray, dict] | None:
        """The newest complete frame and its info, or None if none yet (or mid-write)."""
        seq = int(self.header[0])
        if seq == 0 or seq % 2:
            return None
        frame = self.pixels.copy()
        values = self.header[_INFO_AT : _INFO_AT + len(INFO)].copy()
        if int(self.header[0]) != seq:
            return None
        self.header[_TAKEN] = seq
        info: dict = dict(zip(INFO, (int(v) for v in values)))
        info["return"] /= 1000
        info["pace"] /= 1000
        info["sequence"] = seq
        return frame, info

    def close(self, unlink: bool = False) -> None:
        del self.header, self.pixels
        self.shm.close()
        if unlink:
            self.shm.unlink()


@dataclass(frozen=True)
class PlayerSpec:
    run_path: str
    cfg: dict
    frame_name: str
    height: int
    width: int
    realtime: bool = True
    camera_id: int = 0  # used only when player_main gets no controls
    max_fps: float = 30.0  # most frames rendered per second (and only those the reader takes)
    cpu_share: float = 0.0  # most CPU time per second it may use (cores); 0: no limit


class CpuBudget:
    """Keeps a process under `share` cores of CPU time by sleeping when it gets ahead.

    A priority alone does not work for the showcase: at the lowest priority it is starved by
    workers that keep every core busy (no frames at all), at normal priority it takes a worker's
    share. With a budget it plays (in slow motion when it must) and costs at most its share.
    """

    def __init__(self, share: float, window_s: float = 10.0):
        self.share, self.window_s = share, window_s
        self.restart()

    def restart(self) -> None:
        """Count from now: time used while the budget did not apply is not charged later."""
        self.cpu0, self.wall0 = time.process_time(), time.monotonic()

    def throttle(self) -> float:
        """Sleep as long as needed to be back within budget; returns the seconds slept."""
        if self.share <= 0:
            return 0.0
        ahead = (time.process_time() - self.cpu0) / self.share - (time.monotonic() - self.wall0)
        if ahead > 0:
            time.sleep(ahead)
        if time.monotonic() - self.wall0 > self.window_s:
            self.restart()
        return max(0.0, ahead)


@dataclass
class ShowcaseControls:
    """What the run changes while the player plays; read every player step, so a change shows
    within one step without restarting the player (ctx.Value("i") / ctx.Event objects)."""

    camera: Any  # dm_control camera id; -1 is MuJoCo's free camera
    source: Any  # -1: the merged weights, k: worker k's newest weights
    reset: Any  # set: end the current episode now and start a new one
    training_paused: Any = None  # set: the workers are paused, the CPU budget is lifted


def task_cameras(task: str) -> list[str]:
    """A task's camera names in id order ("camera K" for an unnamed one)."""
    env = DMControlEnv(task)  # loads the MuJoCo model only; no renderer until render()
    try:
        model = env.physics.model
        return [model.id2name(i, "camera") or f"camera {i}" for i in range(model.ncam)]
    finally:
        env.close()


def merged_file(run_path: Path) -> Path:
    return merged_path(run_path)


def worker_files(run_path: Path, worker: int) -> tuple[Path, Path]:
    """Worker k's weights as it merged them last, and its last checkpoint."""
    return merge_dir(run_path) / weights_name(worker), checkpoint_path(run_path, worker)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:  # missing, or replaced between two calls
        return None


def weights_file(run_path: Path, source: int) -> tuple[Path, float] | None:
    """(file, mtime) of the weights to show for a source, or None: nothing yet (untrained).

    Merged (-1): merge/merged.pt, before the first merge worker 0's checkpoint, else the run's
    start weights (--load). Worker k: the
    newer of its last merge contribution and its last checkpoint.
    """
    if source < 0:
        for path in (merged_file(run_path), worker_files(run_path, 0)[1], start_path(run_path)):
            mtime = _mtime(path)
            if mtime is not None:
                return path, mtime
        return None
    found = [(p, m) for p in worker_files(run_path, source) if (m := _mtime(p)) is not None]
    return max(found, key=lambda pm: pm[1]) if found else None


def model_weights(state: dict) -> tuple[dict, int, int]:
    """(model state dict, merge round, agent step) of a merge file or a worker checkpoint.

    Merge files hold {"model", "round", "step"} (files from before steps were stored: step -1);
    checkpoints hold the whole trainer state, the model inside "agent", and no round (-1).
    """
    if "model" in state:
        step = state.get("step")
        return state["model"], int(state.get("round", -1)), -1 if step is None else int(step)
    return state["agent"]["model"], -1, int(state["step"])


class _ShownWeights:
    """Keeps the player's model on the newest weights of the chosen source."""

    def __init__(self, agent: TDMPC2, run_path: Path, log: RunDir):
        self.agent, self.run_path, self.log = agent, run_path, log
        # Kept to show "untrained" again when switching to a source with no weights yet.
        self.untrained = {k: v.clone() for k, v in agent.model_state().items()}
        self.loaded: tuple | None = None  # (source, path, mtime) now in the model
        self.source, self.round, self.step = -1, -1, -1

    def _newest(self, source: int) -> tuple[tuple, tuple[Path, float] | None]:
        """(key to compare with `loaded`, (file, mtime) or None) of a source's newest weights."""
        found = weights_file(self.run_path, source)
        return ((source, *found) if found else (source, None, None)), found

    def newer(self) -> bool:
        """Whether the shown source has weights newer than those loaded (two stat() calls)."""
        return self.loaded is not None and self._newest(self.source)[0] != self.loaded

    def refresh(self, source: int) -> None:
        """Load the source's newest weights unless they are the ones already loaded."""
        key, found = self._newest(source)
        if key == self.loaded:
            return
        switched = self.loaded is None or self.loaded[0] != source
        self.loaded, self.source = key, source
        if found is None:
            self.agent.load_model_state(self.untrained, [0])
            self.round, self.step = -1, -1
            return
        try:
            state = load_state(found[0], self.agent.device)
            model, round_, step = model_weights(state)
            self.agent.load_model_state(self.agent.checked_model_state(model), [0])
            self.round, self.step = round_, step
        except (WeightsError, KeyError, RuntimeError, TypeError, ValueError) as err:
            self.log.log("error", message=f"showcase could not load {found[0]}: {err}")
            if switched:  # never show another source's weights under this source's name
                self.agent.load_model_state(self.untrained, [0])
                self.round, self.step = -1, -1


def light_rendering(env: DMControlEnv) -> None:
    """Render a 400x300 view for a fraction of the default cost: no multisampling and a
    smaller shadow map (on software GL 11 ms a frame instead of 28, the look nearly the same)."""
    quality = env.physics.model.vis.quality
    quality.offsamples = 0
    quality.shadowsize = min(quality.shadowsize, 512)


class Pace:
    """The showcase's speed relative to the simulation's clock over the last few seconds."""

    def __init__(self, step_seconds: float, window_s: float = 5.0):
        self.step_seconds, self.window_s = step_seconds, window_s
        self.times: deque[float] = deque()
        self.speed = 1.0

    def slow(self) -> bool:
        """Under half of real time: an episode takes minutes rather than seconds."""
        return self.speed < 0.5

    def step(self, now: float) -> float:
        self.times.append(now)
        while self.times[0] < now - self.window_s:
            self.times.popleft()
        span = now - self.times[0]
        simulated = (len(self.times) - 1) * self.step_seconds
        self.speed = 1.0 if span <= 0 else min(1.0, simulated / span)
        return self.speed


def player_main(
    spec: PlayerSpec, render_paused, stop, controls: ShowcaseControls | None = None
) -> None:
    # Ctrl+C is the run's to handle (it stops this process); SIGTERM: end quietly.
    term_signal = child_signals()
    # The showcase is best effort: below the workers' priority, and within a CPU budget, so it
    # slows down rather than take time from training.
    os.nice(10)
    os.environ.setdefault("LP_NUM_THREADS", "1")  # software GL: one render thread, not all cores
    apply_threads(SHOWCASE_THREADS)
    parent = os.getppid()
    budget = CpuBudget(spec.cpu_share)
    if controls is None:
        controls = ShowcaseControls(mp.Value("i", spec.camera_id), mp.Value("i", -1), mp.Event())
    cfg = Config(**spec.cfg)
    env = DMControlEnv(
        cfg.task,
        cfg.seed + 99_999,
        cfg.action_repeat,
        cfg.episode_length,
        render_size=(spec.height, spec.width),
    )
    light_rendering(env)
    agent = TDMPC2(cfg, env.observation_space.shape[0], env.action_space.shape[0])
    frames = FrameBuffer(spec.height, spec.width, spec.frame_name, create=False)
    log = RunDir(spec.run_path, metrics=PLAYER_LOG)
    shown = _ShownWeights(agent, Path(spec.run_path), log)
    step_seconds = env.physics.timestep() * cfg.action_repeat
    pace = Pace(step_seconds)
    episode, last_render = 0, 0.0
    try:
        while not stop.is_set() and not term_signal.is_set() and os.getppid() == parent:
            # A reset asked for while the last episode was ending is served by this new one.
            controls.reset.clear()
            shown.refresh(controls.source.value)
            obs, _ = env.reset(seed=cfg.seed + episode)
            total, done, t, t0 = 0.0, False, 0, True
            started = next_time = time.monotonic()
            while not done and not stop.is_set() and not term_signal.is_set():
                # A new source ends the episode too, so an episode's return is one policy's.
                if controls.reset.is_set() or controls.source.value != shown.source:
                    break
                # In slow motion an episode can take minutes: after SLOW_SWITCH_S show newer
                # weights rather than finish it with old ones (then not logged, like a reset).
                played = time.monotonic() - started
                if pace.slow() and t % SLOW_CHECK_STEPS == 0 and played >= SLOW_SWITCH_S:
                    if shown.newer():
                        break
                action = agent.act(torch.from_numpy(obs), t0=t0, eval_mode=True)
                obs, reward, terminated, truncated, _ = env.step(action.numpy())
                total, t, t0, done = total + reward, t + 1, False, terminated or truncated
                now = time.monotonic()
                speed = pace.step(now)
                due = now - last_render >= 1.0 / spec.max_fps
                if due and frames.wanted() and not render_paused.is_set():
                    last_render = now
                    camera = controls.camera.value
                    frames.write(
                        env.render(camera_id=camera),
                        episode,
                        t,
                        shown.round,
                        total,
                        camera=camera,
                        source=shown.source,
                        weights_step=shown.step,
                        pace=speed,
                    )
                paused = controls.training_paused
                if paused is not None and paused.is_set():
                    budget.restart()  # the cores are free: no budget, and no debt after
                else:
                    budget.throttle()
                if spec.realtime:
                    # Behind real time (slow CPU or budget): go on from now, no catch-up burst.
                    next_time = max(next_time + step_seconds, time.monotonic() - step_seconds)
                    time.sleep(max(0.0, next_time - time.monotonic()))
                if os.getppid() != parent:  # the run's process died (kill -9): no orphan
                    break
            if done:
                log.log(
                    "showcase_episode",
                    episode=episode,
                    ret=total,
                    weights_round=shown.round,
                    source=shown.source,
                    weights_step=shown.step,
                )
            episode += 1
    finally:
        log.close()
        frames.close()
        env.close()
