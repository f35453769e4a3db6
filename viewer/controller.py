"""The window's link to a run: a background thread that owns the Run and does all waiting.

The frame loop never waits on a worker or on disk: it sends commands here (data: a knob change,
pause, a worker more..., workers/run/commands.py; or a new run) and reads `view`, a latest-wins
snapshot that this thread rebuilds a few times a second from the run's events and progress.
This thread hands each command to the run's one dispatch (BaseRun.do) and shows its notices.
Frames come straight from shared memory through `read_frame`, which never blocks.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import UserError
from viewer.machine_use import MachineUse
from viewer.model import RunModel
from viewer.series import published_curve, published_note
from viewer.timeline import TimelinePoint, timeline_points
from viewer.view import ChartOptions, RaceView, View
from workers.door import (
    BaseRun,
    ChooseShowcase,
    Command,
    Lane,
    OpenShowcase,
    ShowPanes,
    check_race,
    lane_source,
    race_top,
    served_notice,
    sharing,
    source_album,
)

POLL_S = 0.25
ALBUM_S = 1.0  # the album's file names are listed at most this often (the timeline's)
WORKER_NICE = 5  # workers a window starts yield to it, so frames never wait behind training


@dataclass(frozen=True)
class _Open:
    """Stop the run shown (if any) and open the one `make_run` gives (the controller's own)."""

    make_run: Callable[[], BaseRun]


@dataclass(frozen=True)
class _Close:
    """Stop the run shown: the window closes."""


class Controller:
    def __init__(self, frame_size: tuple[int, int] = (300, 400), viewport: str = "auto"):
        self.frame_size = frame_size
        self.viewport = viewport  # the showcase's mode, kept for the next run opened
        self.options = ChartOptions()
        self.view = View(version=0, phase="idle")
        self.notices: queue.SimpleQueue[str] = queue.SimpleQueue()  # one-line messages
        self._commands: queue.SimpleQueue[Command | _Open | _Close | None] = queue.SimpleQueue()
        self._run_lock = threading.Lock()
        self._run: BaseRun | None = None
        self._model: RunModel | None = None
        self._phase = "idle"
        self._cameras: list[str] = []
        self._published = None
        self._published_note = ""
        self._machine = MachineUse()
        self._album: tuple[float, int, list] = (-ALBUM_S, 0, [])  # (listed at, source, entries)
        self._thread = threading.Thread(target=self._loop, name="run-controller", daemon=True)
        self._thread.start()

    # called from the GUI thread: each returns at once ---------------------------------
    def open(self, make_run: Callable[[], BaseRun]) -> None:
        """Stop the current run (if any) and start the one `make_run` creates or resumes."""
        self._commands.put(_Open(make_run))

    def send(self, command: Command) -> None:
        """Ask the run for `command` (a knob change, pause, a worker more, ...: the commands
        of workers/run/commands.py): queued for this thread, which hands it to the run's one
        dispatch (BaseRun.do) and shows its notices; one that only sets a flag is done now."""
        if isinstance(command, ChooseShowcase) and command.mode is not None:
            self.viewport = command.mode  # kept for the next run opened
        if not command.instant:
            self._commands.put(command)
        elif (run := self._run) is not None:
            run.do(command)  # sets an Event: never blocks

    def sender(self, command: Command) -> Callable[..., None]:
        """A button's callback that sends `command` (Dear PyGui's arguments are ignored)."""
        return lambda *_: self.send(command)

    def race_problem(self, lanes: list[Lane], replicas: int = 1) -> str | None:
        """Why the run cannot race in `lanes`, `replicas` times each, now (None: it can).
        Reads settings only."""
        run = self._run
        if run is None:
            return "no run: start one first"
        if run.race.record().lanes:
            return "a race is on: promote a lane to end it first"
        try:
            check_race(run.settings, lanes, replicas)
        except UserError as err:
            return str(err)
        return None

    def frame_sequence(self) -> int:
        """The showcase's frame counter, to see whether a new frame came without copying it."""
        if not self._run_lock.acquire(blocking=False):
            return 0
        try:
            return self._run.showcase.frame_sequence() if self._run is not None else 0
        finally:
            self._run_lock.release()

    def read_frame(self):
        """The newest showcase frame and its info, or None; never waits."""
        if not self._run_lock.acquire(blocking=False):
            return None
        try:
            return self._run.showcase.read_frame() if self._run is not None else None
        finally:
            self._run_lock.release()

    def shutdown(self, timeout: float = 180.0) -> None:
        """Stop the run (workers write checkpoints) and end the thread."""
        self._commands.put(_Close())
        self._commands.put(None)
        self._thread.join(timeout)

    # the controller thread ----------------------------------------------------------
    def _loop(self) -> None:
        while True:
            try:
                command = self._commands.get(timeout=POLL_S)
            except queue.Empty:
                command = False
            if command is None:
                return
            try:
                if command:
                    self._handle(command)
                self._refresh()
            except UserError as err:
                self.notices.put(f"refused: {err}")
            except Exception as err:  # the window must survive anything a run throws
                self.notices.put(f"error: {type(err).__name__}: {err}")
                traceback.print_exc()

    def _handle(self, command: Command | _Open | _Close) -> None:
        if isinstance(command, _Open):
            self._open(command.make_run)
        elif isinstance(command, _Close):
            self._stop_run()
        elif self._run is not None:
            outcome = self._run.do(command)
            for line in outcome.notices:
                self.notices.put(line)
            if outcome.stop:  # the Stop button on a run this window owns
                self._stop_run()

    def _open(self, make_run: Callable[[], BaseRun]) -> None:
        self._stop_run()
        self._phase = "starting"
        self._publish()
        try:
            run = make_run()
        except UserError:
            self._phase = "idle" if self._run is None else "stopped"
            raise
        run.do(OpenShowcase(*self.frame_size, mode=self.viewport, nice=WORKER_NICE))
        if run.cfg.obs == "rgb":  # a run from pixels opens on what its agent sees
            run.do(ShowPanes("agent-view"))
        with self._run_lock:
            self._run = run
        workers = run.settings.workers
        control = run.settings.control_index  # not workers - 1: workers may have been added
        self._model = RunModel(workers, run.cfg.resolved_seed_steps, control)
        self._cameras = run.showcase.camera_names()
        published = published_curve(run.cfg.task, run.cfg.action_repeat, run.cfg.obs)
        self._published_note = published_note(run.cfg, published is not None)
        self._published = (published[0].tolist(), published[1].tolist()) if published else None
        # The race table's thresholds are fractions of the published end where it applies.
        self._model.race.published_final, self._model.race.top_note = race_top(run.cfg)
        self._phase = "running"
        verb = run.wording.opened
        count = f"{workers} worker{'s' * (workers != 1)}"
        self.notices.put(f"{verb} {run.path} ({count}, {run.cfg.task})")

    def _stop_run(self) -> None:
        run = self._run
        if run is None or self._phase in ("stopping", "stopped"):
            return
        self._phase = "stopping"
        self._publish()
        run.stop()  # workers write a checkpoint each before they exit
        with self._run_lock:
            self._phase = "stopped"
        if run.wording.stopped:
            self.notices.put(run.wording.stopped.format(path=run.path))

    def _refresh(self) -> None:
        run, model = self._run, self._model
        if run is not None:  # a montage goes on after its run stopped
            for line in run.montages.lines():
                self.notices.put(line)
        if run is not None and model is not None and self._phase == "running":
            model.ingest(run.new_events())
            # A worker restarted...; those also recorded (a crash) come as model errors.
            for line in run.notices(recorded=False):
                self.notices.put(line)
            self._serve_requests(run)
        self._publish()

    def _serve_requests(self, run: BaseRun) -> None:
        """What other windows asked of a run this window owns (a view serves none)."""
        for request in run.serve_requests():
            self.notices.put(served_notice(request))
            if request.action == "stop":
                self._stop_run()
                return

    def _album_points(self, run: BaseRun, model: RunModel, source: int) -> list[TimelinePoint]:
        """The shown source's album with the returns recorded; its folder is listed at most
        once every ALBUM_S (or at once when the source changes), never per frame."""
        listed_at, listed_source, entries = self._album
        now = time.monotonic()
        if source != listed_source or now - listed_at >= ALBUM_S:
            entries = source_album(run.path, source)
            self._album = (now, source, entries)
        return timeline_points(entries, model.returns, model.evals)

    def _publish(self) -> None:
        run, model, o = self._run, self._model, self.options
        base = dict(version=self.view.version + 1, phase=self._phase, machine=self._machine.text())
        if run is None or model is None:
            self.view = View(**base)
            return
        progress = run.workers.progress()
        in_run = [p for p in progress if p["state"] != "removed"]
        version, requested = run.knobs.values()  # damaged: the last good values
        merges, knob_marks, _ = model.marks(o.wall_axis)
        record = run.race.record()
        merging = [n for n in range(len(record.lanes)) if record.merges(n)]  # copies with a mean
        model.replicas = record.replicas
        showcase = run.showcase.settings()
        race, returns, bands = None, model.return_lines(o.wall_axis, o.smoothing), {}
        table = model.race.table(record, in_run, time.time()) if record.lanes else None
        if table is not None:
            race = RaceView(record.race_lanes, table, sharing(run.settings, run.cfg, record))
            start = model.race.start_time(record)
            if o.by_lane and start is not None:
                returns, bands = model.lane_lines(table.rows, o.wall_axis, start)
        self.view = View(
            **base,
            task=run.cfg.task,
            obs=run.cfg.obs,
            run_path=str(run.path),
            wording=run.wording,
            paused=run.is_paused(),
            workers=model.worker_rows(progress),
            knobs=model.knob_rows(requested, in_run, record),
            knob_version=version,
            startup=model.startup(
                in_run, run.cfg.resolved_seed_steps, run.cfg.resolved_pretrain_updates
            )
            if self._phase == "running"
            else None,
            returns=returns,
            bands=bands,
            speed=model.speed_lines(o.wall_axis),
            losses=model.loss_lines(o.loss, o.wall_axis, o.smoothing),
            distances=model.distance_lines(o.wall_axis),
            merge_marks=merges,
            knob_marks=knob_marks,
            published=None if o.wall_axis else self._published,
            published_note=self._published_note,
            errors=list(model.errors),
            error_count=model.error_count,
            notes=list(model.notes),
            note_count=model.note_count,
            cameras=self._cameras,
            sources=["merged"]
            + [model.worker_label(w) for w in range(run.settings.workers)]
            + [f"{record.pool_name(n)} merged" for n in merging],
            source_ids=[-1, *range(run.settings.workers)] + [lane_source(n) for n in merging],
            source=showcase["source"],
            showcase_mode=showcase["mode"],
            album=self._album_points(run, model, showcase["source"]),
            pin=showcase["pin"],
            panes=showcase["panes"],
            race=race,
        )
