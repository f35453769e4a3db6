"""The showcase player: a process that plays a policy of the run and renders it offscreen.

It shows the merged weights or, when asked, one worker's newest weights (shown_weights.py),
reloading them at each episode start when the file changed. The camera, the source and an
episode reset are shared values the run changes while the player runs. It acts with the planner
in evaluation mode at real-time pace (or as fast as it can), writes each rendered frame into
shared memory (frame_buffer.py) and logs each finished episode's return to player.jsonl."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.config import Config
from agent.envs import Env, env_of
from workers.host.signals import child_signals
from workers.host.threads import SHOWCASE_THREADS, apply_threads
from workers.rundir.directory import RunDir
from workers.rundir.paths import PLAYER_LOG
from workers.rundir.records import ShowcaseEpisode
from workers.showcase.frames import FrameBuffer
from workers.showcase.shown_weights import ShownWeights

SLOW_CHECK_STEPS = 5  # in slow motion, look for newer weights every this many steps
SLOW_SWITCH_S = 20.0  # ... once an episode has played this long (short ones still finish)


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


def task_cameras(cfg: Config) -> list[str]:
    """The task's camera names in id order ("camera K" for an unnamed one; none for an env
    without a MuJoCo model)."""
    env = env_of(cfg, 0)  # loads the model only; no renderer until render()
    try:
        return env.camera_names()
    finally:
        env.close()


def light_rendering(env: Env) -> None:
    """Render a 400x300 view for a fraction of the default cost: no multisampling and a
    smaller shadow map (on software GL 11 ms a frame instead of 28, the look nearly the same)."""
    if env.mujoco_model is None:
        return
    quality = env.mujoco_model.vis.quality
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
    env = env_of(cfg, cfg.seed + 99_999, render_size=(spec.height, spec.width))
    light_rendering(env)
    agent = TDMPC2(cfg, env.observation_space.shape[0], env.action_space.shape[0])
    frames = FrameBuffer(spec.height, spec.width, spec.frame_name, create=False)
    log = RunDir(spec.run_path, metrics=PLAYER_LOG)
    shown = ShownWeights(agent, Path(spec.run_path), log)
    step_seconds = env.control_timestep
    blank = np.zeros((spec.height, spec.width, 3), np.uint8)  # for an env that cannot render
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
                    frame = env.render(camera_id=camera) if env.renders else None
                    frames.write(
                        blank if frame is None else frame,
                        episode,
                        t,
                        shown.round,
                        total,
                        camera=camera,
                        source=shown.source,
                        weights_step=shown.step,
                        pace=speed,
                        renders=frame is not None,
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
                    ShowcaseEpisode(
                        episode=episode,
                        ret=total,
                        weights_round=shown.round,
                        source=shown.source,
                        weights_step=shown.step,
                    )
                )
            episode += 1
    finally:
        log.close()
        frames.close()
        env.close()
