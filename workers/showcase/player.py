"""The showcase player: a process that plays a policy of the run and renders it offscreen.

Live, it shows the merged weights or, when asked, one worker's newest weights
(shown_weights.py), reloading them at each episode start when the file changed, and acts with
the planner in evaluation mode at real-time pace (or as fast as its CPU budget allows); each
finished live episode's return goes to player.jsonl. As a replay (replay.py) it draws the
source's newest finished episode again from its recorded poses at 1x. The camera, the source,
the mode and an episode reset are shared values the run changes while the player runs, and so
are an album episode pinned from the timeline (replayed in a loop) and the panes (several
replays tiled into one frame: then and now, or one per race lane; episodes.py chooses them).
Each rendered frame goes into shared memory (frames.py). Over 300 lines because live play,
replays and panes share one process's env, CPU budget, frame cap and frame buffer."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.config import Config
from agent.envs import Env, env_of
from agent.pixels import frames_of
from workers.host.signals import child_signals
from workers.host.threads import SHOWCASE_THREADS, apply_threads
from workers.rundir.directory import RunDir
from workers.rundir.paths import PLAYER_LOG
from workers.rundir.records import ShowcaseEpisode
from workers.rundir.replays import KINDS, EpisodeReplay
from workers.showcase.agent_view import PoseFrames, compose, pose_frame, view_width
from workers.showcase.episodes import LAYOUTS, find_entry, pane_boxes, pane_episodes
from workers.showcase.frames import FrameBuffer, PaneInfo
from workers.showcase.pacing import CpuBudget, Pace
from workers.showcase.replay import HOLD_S, MODES, Playhead, newest_episode, use_replay
from workers.showcase.shown_weights import ShownWeights

ONE_VIEW = ("single", "agent-view")  # layouts of one episode (the agent's frames beside it)
SLOW_CHECK_STEPS = 5  # in slow motion, look for newer weights every this many steps
SLOW_SWITCH_S = 20.0  # ... once an episode has played this long (short ones still finish)
LIVE_PROBE_S = 3.0  # auto mode judges live play's speed after this long
REPLAY_TICK_S = 0.02  # a replay looks for a wanted frame at least this often


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


@dataclass
class ShowcaseControls:
    """What the run changes while the player plays; read every player step, so a change shows
    within one step without restarting the player (ctx.Value("i") / ctx.Event objects)."""

    camera: Any  # dm_control camera id; -1 is MuJoCo's free camera
    source: Any  # -1: the merged weights, k: worker k's newest weights
    reset: Any  # set: end the current episode now and start a new one
    training_paused: Any = None  # set: the workers are paused, the CPU budget is lifted
    mode: Any = None  # index into MODES: auto (replay where live is slow), live, replay
    # (worker, index into KINDS, step) of the album episode pinned; worker -1: none
    # (ctx.Array("q", 3), read and written under its lock so the three agree)
    pin: Any = None
    panes: Any = None  # index into LAYOUTS (episodes.py): one view, then and now, lanes


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
    smaller shadow map (on software GL 11 ms a frame instead of 28, the look nearly the same).
    Not for an env whose observations are frames: the agent must see what it trained on, and
    GL takes these settings once per context, for every size it renders."""
    if env.mujoco_model is None or getattr(env, "obs", "state") == "rgb":
        return
    quality = env.mujoco_model.vis.quality
    quality.offsamples = 0
    quality.shadowsize = min(quality.shadowsize, 512)


class Player:
    """The player's loop: live episodes (the planner acting with the shown weights) or replays
    of finished episodes (recorded poses at 1x, no planning), as the controls ask."""

    def __init__(self, spec: PlayerSpec, render_paused, stop, controls: ShowcaseControls, term):
        self.spec, self.render_paused, self.stop, self.controls = (
            spec,
            render_paused,
            stop,
            controls,
        )
        self.term = term
        self.parent = os.getppid()
        self.budget = CpuBudget(spec.cpu_share)
        self.cfg = cfg = Config(**spec.cfg)
        self.env = env_of(cfg, cfg.seed + 99_999, render_size=(spec.height, spec.width))
        light_rendering(self.env)
        self.agent = TDMPC2(
            cfg, self.env.observation_space.shape[0], self.env.action_space.shape[0]
        )
        self.frames = FrameBuffer(spec.height, spec.width, spec.frame_name, create=False)
        self.log = RunDir(spec.run_path, metrics=PLAYER_LOG)
        self.shown = ShownWeights(self.agent, Path(spec.run_path), self.log)
        self.blank = np.zeros((spec.height, spec.width, 3), np.uint8)  # an env that cannot render
        self.pace = Pace(self.env.control_timestep)
        self.live_speed: float | None = None  # the live pace last measured (auto mode's guide)
        self.episode, self.last_render, self.rendered = 0, 0.0, False
        self.clock, self.sleep = time.monotonic, time.sleep  # a replay's (tests: a fake clock)
        # The pinned episode, loaded once: it loops even if the album thins its file out.
        self.pinned_replay: tuple[tuple[int, int, int], EpisodeReplay | None] | None = None

    def running(self) -> bool:
        alive = os.getppid() == self.parent  # the run's process died (kill -9): no orphan
        return alive and not self.stop.is_set() and not self.term.is_set()

    def mode(self) -> str:
        value = self.controls.mode.value if self.controls.mode is not None else 0
        return MODES[value] if 0 <= value < len(MODES) else "auto"

    def layout(self) -> str:
        value = self.controls.panes.value if self.controls.panes is not None else 0
        return LAYOUTS[value] if 0 <= value < len(LAYOUTS) else "single"

    def pin(self) -> tuple[int, int, int] | None:
        """(worker, kind index, step) of the album episode pinned, or None."""
        shared = self.controls.pin
        if shared is None:
            return None
        with shared.get_lock():
            worker, kind, step = shared[:]
        return (worker, kind, step) if worker >= 0 and 0 <= kind < len(KINDS) else None

    def pinned_episode(self, pin: tuple[int, int, int]) -> EpisodeReplay | None:
        if self.pinned_replay is None or self.pinned_replay[0] != pin:
            worker, kind, step = pin
            entry = find_entry(self.spec.run_path, worker, KINDS[kind], step)
            self.pinned_replay = (pin, entry.load() if entry is not None else None)
        return self.pinned_replay[1]

    def wants_replay(self) -> bool:
        paused = self.controls.training_paused
        # While training is paused the budget is lifted: live play is fast again.
        budgeted = self.spec.cpu_share > 0 and not (paused is not None and paused.is_set())
        return use_replay(self.mode(), self.live_speed, budgeted)

    def run(self) -> None:
        self.budget.restart()  # loading the model and the env is not charged to the frames
        try:
            while self.running():
                # A reset asked for while the last episode was ending is served by this one.
                self.controls.reset.clear()
                if self.layout() not in ONE_VIEW and self.env.renders:
                    self.play_panes(self.layout())
                    continue
                pin = self.pin()
                if pin is not None:
                    pinned = self.pinned_episode(pin)
                    if pinned is not None and self.fits(pinned):
                        self.play_replay(pinned, pinned=True)
                        continue
                if self.wants_replay():
                    replay = newest_episode(Path(self.spec.run_path), self.controls.source.value)
                    if replay is not None and self.fits(replay):
                        self.play_replay(replay)
                        continue
                self.play_live()
        finally:
            self.log.close()
            self.frames.close()
            self.env.close()

    def fits(self, replay: EpisodeReplay) -> bool:
        """The recorded poses are this env's (a file of another model is passed over)."""
        pose = self.env.physics_state() if self.env.renders else None
        return pose is not None and replay.states.shape[1] == len(pose)

    # frames ----------------------------------------------------------------------------
    def frame_due(self, now: float) -> bool:
        """A frame is wanted (the reader took the last one), rendering is on, and the frame
        rate cap allows one."""
        due = now - self.last_render >= 1.0 / self.spec.max_fps
        return due and self.frames.wanted() and not self.render_paused.is_set()

    def render(self, size: tuple[int, int] | None = None) -> tuple[np.ndarray, int, bool]:
        """The env's view (`size`: a pane's (height, width) instead of the frame's)."""
        camera = self.controls.camera.value
        whole = self.env.render_size
        if size is not None:
            self.env.render_size = size  # a pane's own size: a narrower view, not squashed
        try:
            frame = self.env.render(camera_id=camera) if self.env.renders else None
        finally:
            self.env.render_size = whole
        if not self.rendered:
            # The first frame sets up the GL context (0.4 s of CPU on software GL): a one-off,
            # not charged to the budget, which would otherwise hold the next frames back.
            self.rendered = True
            self.budget.restart()
        return (self.blank if frame is None else frame), camera, frame is not None

    def render_shown(self, frames: np.ndarray | None) -> tuple[np.ndarray, int, bool]:
        """render(), with the agent's `frames` (its observation's, agent/pixels.py) in a
        column beside the view when the layout is the agent's view."""
        if frames is None or self.layout() != "agent-view" or not self.env.renders:
            return self.render()
        h, w = self.spec.height, self.spec.width
        view, camera, renders = self.render((h, view_width(h, w)))
        return compose(view, frames, h, w), camera, renders

    def agent_view(self) -> bool:
        """Whether the agent's frames are wanted now (a pixel run, its layout chosen)."""
        return self.cfg.obs == "rgb" and self.layout() == "agent-view"

    def keep_budget(self) -> None:
        paused = self.controls.training_paused
        if paused is not None and paused.is_set():
            self.budget.restart()  # the cores are free: no budget, and no debt after
        else:
            self.budget.throttle()

    # live --------------------------------------------------------------------------------
    def play_live(self) -> None:
        """One episode of the planner acting with the shown weights, at real-time pace or as
        fast as the budget allows; a finished one is logged to player.jsonl."""
        env, agent, shown, controls = self.env, self.agent, self.shown, self.controls
        shown.refresh(controls.source.value)
        obs, _ = env.reset(seed=self.cfg.seed + self.episode)
        total, done, t, t0 = 0.0, False, 0, True
        started = next_time = time.monotonic()
        step_seconds = env.control_timestep
        while not done and self.running():
            # A new source ends the episode too, so an episode's return is one policy's.
            if controls.reset.is_set() or controls.source.value != shown.source:
                break
            # In slow motion an episode can take minutes: after SLOW_SWITCH_S show newer
            # weights rather than finish it with old ones (then not logged, like a reset).
            played = time.monotonic() - started
            if self.pace.slow() and t % SLOW_CHECK_STEPS == 0 and played >= SLOW_SWITCH_S:
                if shown.newer():
                    break
            # Auto mode: once live play has shown itself slow for a while, replay instead.
            if played >= LIVE_PROBE_S:
                self.live_speed = self.pace.speed
                if self.wants_replay():
                    break
            action = agent.act(torch.from_numpy(obs), t0=t0, eval_mode=True)
            obs, reward, terminated, truncated, _ = env.step(action.numpy())
            total, t, t0, done = total + reward, t + 1, False, terminated or truncated
            now = time.monotonic()
            speed = self.pace.step(now)
            if self.frame_due(now):
                self.last_render = now
                seen = frames_of(obs) if self.agent_view() else None
                frame, camera, renders = self.render_shown(seen)
                self.frames.write(
                    frame,
                    self.episode,
                    t,
                    shown.round,
                    total,
                    camera=camera,
                    source=shown.source,
                    weights_step=shown.step,
                    pace=speed,
                    renders=renders,
                    agent_view=seen is not None,
                )
            self.keep_budget()
            if self.spec.realtime:
                # Behind real time (slow CPU or budget): go on from now, no catch-up burst.
                next_time = max(next_time + step_seconds, time.monotonic() - step_seconds)
                time.sleep(max(0.0, next_time - time.monotonic()))
        if done:
            self.log.log(
                ShowcaseEpisode(
                    episode=self.episode,
                    ret=total,
                    weights_round=shown.round,
                    source=shown.source,
                    weights_step=shown.step,
                )
            )
        self.episode += 1

    # replay ------------------------------------------------------------------------------
    def play_replay(self, replay: EpisodeReplay, pinned: bool = False) -> None:
        """One recorded episode at 1x: each frame shows the pose of the moment it is drawn
        (frames the budget cannot afford are skipped, never the time between them). A pinned
        one is played again until the pin or the panes change."""
        controls, source, mode = self.controls, self.controls.source.value, self.mode()
        pin, layout = self.pin(), self.layout()
        head = Playhead(replay, self.clock)
        shown_index = -1
        seen = PoseFrames(replay.states, partial(pose_frame, self.env))
        while self.running() and not head.finished():
            if controls.reset.is_set() or controls.source.value != source or self.mode() != mode:
                break
            if self.pin() != pin or self.layout() != layout:
                break
            now = self.clock()
            index = head.index()
            if index != shown_index and self.frame_due(now):
                self.last_render, shown_index = now, index
                frames = seen.at(index) if self.agent_view() else None  # moves the env
                self.env.show_state(replay.states[index])
                frame, camera, renders = self.render_shown(frames)
                self.frames.write(
                    frame,
                    replay.episode,
                    index,
                    -1,
                    replay.return_at(index),
                    camera=camera,
                    source=source,
                    weights_step=replay.step,
                    pace=1.0,
                    renders=renders,
                    replay=1 + KINDS.index(replay.kind),
                    replay_worker=replay.worker,
                    replay_return=replay.ret,
                    replay_length=replay.length,
                    pinned=pinned,
                    agent_view=frames is not None,
                )
            self.keep_budget()
            # Look again at the next pose's time, or soon for a frame the reader wants.
            wait = (index + 1) * replay.step_seconds - head.elapsed()
            self.sleep(min(max(0.001, wait), REPLAY_TICK_S))

    def play_panes(self, layout: str) -> None:
        """Episodes side by side, each at 1x on its own playhead, tiled into one frame; a
        pane whose episode ended (and held its last pose) starts it again. Returns once every
        pane has played its episode through, so the next call picks the newest ones."""
        controls, source = self.controls, self.controls.source.value
        panes = pane_episodes(self.spec.run_path, layout, source)
        panes = [(r if r is not None and self.fits(r) else None, lane) for r, lane in panes]
        boxes = pane_boxes(self.spec.height, self.spec.width, len(panes))
        heads = [Playhead(r, self.clock) if r is not None else None for r, _ in panes]
        played = [head is None for head in heads]
        infos = [
            PaneInfo(r.worker, 1 + KINDS.index(r.kind), r.step, r.ret, lane)
            if r is not None
            else PaneInfo(lane=lane)
            for r, lane in panes
        ]
        frame = np.zeros((self.spec.height, self.spec.width, 3), np.uint8)
        started = self.clock()
        # Blank panes only (nothing recorded yet): still a second's wait before looking again.
        while self.running() and not (all(played) and self.clock() - started >= HOLD_S):
            if controls.reset.is_set() or controls.source.value != source:
                break
            if self.layout() != layout:
                break
            for n, head in enumerate(heads):
                if head is not None and head.finished():
                    played[n] = True
                    heads[n] = Playhead(head.replay, self.clock)  # loop while others play
            now = self.clock()
            if self.frame_due(now):
                self.last_render = now
                camera = controls.camera.value
                for (top, left, h, w), head in zip(boxes, heads):
                    if head is None:
                        frame[top : top + h, left : left + w] = 0
                        continue
                    self.env.show_state(head.replay.states[head.index()])
                    frame[top : top + h, left : left + w] = self.render((h, w))[0]
                self.frames.write(
                    frame,
                    self.episode,
                    0,
                    -1,
                    0.0,
                    camera=camera,
                    source=source,
                    pace=1.0,
                    replay=1,
                    panes=infos,
                )
            self.keep_budget()
            self.sleep(REPLAY_TICK_S)


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
    if controls is None:
        controls = ShowcaseControls(mp.Value("i", spec.camera_id), mp.Value("i", -1), mp.Event())
    Player(spec, render_paused, stop, controls, term_signal).run()
