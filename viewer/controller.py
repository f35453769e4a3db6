"""The window's link to a run: a background thread that owns the Run and does all waiting.

The frame loop never waits on a worker or on disk: it queues commands here (knob changes, pause,
checkpoint, stop, new run) and reads `view`, a latest-wins snapshot that this thread rebuilds a
few times a second from the run's events and progress. Frames come straight from shared memory
through `read_frame`, which never blocks.
Over 300 lines because every command the window sends runs on its one thread, here.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable

from agent.errors import UserError
from viewer.machine_use import MachineUse
from viewer.model import RunModel
from viewer.series import published_curve, published_note
from viewer.view import ChartOptions, RaceView, View
from workers.door import (
    BaseRun,
    Lane,
    check_race,
    describe_lane,
    lane_source,
    served_notice,
    sharing,
)

POLL_S = 0.25
WORKER_NICE = 5  # workers a window starts yield to it, so frames never wait behind training


# Run methods that, in a view of another process's run, go to that process as requests.
OWNER_ACTIONS = ("pause", "resume_training", "checkpoint")


class Controller:
    def __init__(self, frame_size: tuple[int, int] = (300, 400), viewport: str = "auto"):
        self.frame_size = frame_size
        self.viewport = viewport  # the showcase's mode, kept for the next run opened
        self.options = ChartOptions()
        self.view = View(version=0, phase="idle")
        self.notices: queue.SimpleQueue[str] = queue.SimpleQueue()  # one-line messages
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._run_lock = threading.Lock()
        self._run: BaseRun | None = None
        self._model: RunModel | None = None
        self._phase = "idle"
        self._cameras: list[str] = []
        self._published = None
        self._published_note = ""
        self._machine = MachineUse()
        self._thread = threading.Thread(target=self._loop, name="run-controller", daemon=True)
        self._thread.start()

    # called from the GUI thread: each returns at once ---------------------------------
    def open(self, make_run: Callable[[], BaseRun]) -> None:
        """Stop the current run (if any) and start the one `make_run` creates or resumes."""
        self._commands.put(lambda: self._open(make_run))

    def set_knobs(self, lane: int | None = None, **changes: object) -> None:
        """New knob values, for lane `lane` of a race or (None) for every worker."""
        self._commands.put(lambda: self._set_knobs(changes, lane))

    def start_race(self, lanes: list[Lane]) -> None:
        """Split the run's workers into `lanes`, each with its changes, size and merging."""
        self._commands.put(lambda: self._start_race(lanes))

    def promote(self, lane: int, weights: bool = True) -> None:
        """End the race with lane `lane`'s values and (`weights`) its weights for every worker."""
        self._commands.put(lambda: self._promote(lane, weights))

    def race_problem(self, lanes: list[Lane]) -> str | None:
        """Why the run cannot race in `lanes` now (None: it can). Reads settings only."""
        run = self._run
        if run is None:
            return "no run: start one first"
        if run.race.record().lanes:
            return "a race is on: promote a lane to end it first"
        try:
            check_race(run.settings, lanes)
        except UserError as err:
            return str(err)
        return None

    def pause(self, paused: bool) -> None:
        self._commands.put(lambda: self._call("pause" if paused else "resume_training"))

    def checkpoint(self) -> None:
        self._commands.put(lambda: self._call("checkpoint", notice="checkpoint requested"))

    def restart_crashed(self) -> None:
        self._commands.put(self._restart_crashed)

    def add_worker(self) -> None:
        self._commands.put(self._add_worker)

    def remove_worker(self) -> None:
        self._commands.put(self._remove_worker)

    def set_showcase(self, **kwargs: int | str) -> None:
        if "mode" in kwargs:
            self.viewport = str(kwargs["mode"])
        self._commands.put(lambda: self._call("set_showcase", **kwargs))

    def reset_showcase(self) -> None:
        self._commands.put(lambda: self._call("reset_showcase"))

    def pause_rendering(self, paused: bool) -> None:
        run = self._run
        if run is not None:
            run.pause_rendering(paused)  # sets an Event: never blocks

    def stop(self) -> None:
        """The Stop button: stop the run (a view of another process's: ask that process to)."""
        self._commands.put(self._stop_button)

    def frame_sequence(self) -> int:
        """The showcase's frame counter, to see whether a new frame came without copying it."""
        if not self._run_lock.acquire(blocking=False):
            return 0
        try:
            return self._run.frame_sequence() if self._run is not None else 0
        finally:
            self._run_lock.release()

    def read_frame(self):
        """The newest showcase frame and its info, or None; never waits."""
        if not self._run_lock.acquire(blocking=False):
            return None
        try:
            return self._run.read_frame() if self._run is not None else None
        finally:
            self._run_lock.release()

    def shutdown(self, timeout: float = 180.0) -> None:
        """Stop the run (workers write checkpoints) and end the thread."""
        self._commands.put(self._stop_run)
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
                    command()
                self._refresh()
            except UserError as err:
                self.notices.put(f"refused: {err}")
            except Exception as err:  # the window must survive anything a run throws
                self.notices.put(f"error: {type(err).__name__}: {err}")
                traceback.print_exc()

    def _call(self, method: str, notice: str | None = None, **kwargs: object) -> None:
        if self._run is None:
            return
        getattr(self._run, method)(**kwargs)
        if method in ("pause", "resume_training"):
            notice = notice or ("training paused" if method == "pause" else "training resumed")
        if notice and method in OWNER_ACTIONS:
            notice += self._run.wording.asked
        if notice:
            self.notices.put(notice)

    def _stop_button(self) -> None:
        if self._run is not None and self._run.stop_elsewhere():
            self.notices.put("stop asked of the process that owns the run: its workers stop")
            return
        self._stop_run()

    def _set_knobs(self, changes: dict, lane: int | None = None) -> None:
        if self._run is not None:
            version = self._run.set_knobs(lane=lane, **changes)
            text = ", ".join(f"{k}={v}" for k, v in changes.items())
            where = "" if lane is None else f" (lane {lane})"
            self.notices.put(f"knobs v{version}{where}: {text}")

    def _start_race(self, lanes: list[Lane]) -> None:
        if self._run is not None:
            version = self._run.race.start(lanes)
            text = "; ".join(
                f"lane {n}: {describe_lane(lane) or 'as the run'}" for n, lane in enumerate(lanes)
            )
            self.notices.put(f"race started (knobs v{version}), from the merged weights: {text}")
            self._show_racing_weights(self._run)

    def _promote(self, lane: int, weights: bool) -> None:
        if self._run is not None:
            version = self._run.race.promote(lane, weights)
            if self._run.showcase_settings()["source"] <= -2:  # a lane's: the race is over
                self._run.set_showcase(source=-1)
            what = (
                "its values and its weights for every worker"
                if weights
                else "its values for every worker; the next merge averages every worker's weights"
            )
            self.notices.put(f"lane {lane} promoted (knobs v{version}): {what}")

    def _restart_crashed(self) -> None:
        if self._run is None:
            return
        for row in self._run.progress():
            if row["state"] == "crashed":
                self._run.restart_worker(row["worker"])
                self.notices.put(f"worker {row['worker']} restarted from the merged weights")

    def _add_worker(self) -> None:
        if self._run is not None:
            index = self._run.add_worker()
            verb = self._run.wording.added
            lane = self._run.race.record().lane_of(index)
            pool = "the merged weights" if lane is None else f"lane {lane}'s merged weights"
            self.notices.put(f"worker {index} {verb}: it starts from {pool}")

    def _remove_worker(self) -> None:
        """Take out the newest merging worker (a lane that never merges keeps its own)."""
        run = self._run
        if run is None:
            return
        record = run.race.record()
        merging = [w for w in run.settings.merging if record.merges(record.lane_of(w))]
        if not merging:
            raise UserError("no merging worker left to remove")
        run.remove_worker(merging[-1])
        verb = run.wording.removed
        self.notices.put(f"worker {merging[-1]} {verb}: it writes a checkpoint and leaves")

    def _open(self, make_run: Callable[[], BaseRun]) -> None:
        self._stop_run()
        self._phase = "starting"
        self._publish()
        try:
            run = make_run()
        except UserError:
            self._phase = "idle" if self._run is None else "stopped"
            raise
        run.launch(nice=WORKER_NICE)
        run.set_showcase(mode=self.viewport)
        run.start_player(*self.frame_size)
        self._show_racing_weights(run)
        with self._run_lock:
            self._run = run
        workers = run.settings.workers
        control = run.settings.control_index  # not workers - 1: workers may have been added
        self._model = RunModel(workers, run.cfg.resolved_seed_steps, control)
        self._cameras = run.camera_names()
        published = published_curve(run.cfg.task, run.cfg.action_repeat)
        self._published_note = published_note(run.cfg, published is not None)
        self._published = (published[0].tolist(), published[1].tolist()) if published else None
        if published is not None:  # the race table's thresholds are fractions of its end
            self._model.race.published_final = float(published[1][-1])
        self._phase = "running"
        verb = run.wording.opened
        count = f"{workers} worker{'s' * (workers != 1)}"
        self.notices.put(f"{verb} {run.path} ({count}, {run.cfg.task})")

    def _show_racing_weights(self, run: BaseRun) -> None:
        """In a race the run's own pool does not merge: a showcase on "merged" plays the first
        merging lane's merged weights instead (the source list offers every lane's)."""
        record = run.race.record()
        merging = [n for n in range(len(record.lanes)) if record.merges(n)]
        if merging and run.showcase_settings()["source"] == -1:
            run.set_showcase(source=lane_source(merging[0]))

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

    def _publish(self) -> None:
        run, model, o = self._run, self._model, self.options
        base = dict(version=self.view.version + 1, phase=self._phase, machine=self._machine.text())
        if run is None or model is None:
            self.view = View(**base)
            return
        progress = run.progress()
        in_run = [p for p in progress if p["state"] != "removed"]
        version, requested = run.knob_values()  # damaged: the last good values
        merges, knob_marks, _ = model.marks(o.wall_axis)
        record = run.race.record()
        merging = [n for n in range(len(record.lanes)) if record.merges(n)]  # lanes with a mean
        showcase = run.showcase_settings()
        race, returns = None, model.return_lines(o.wall_axis, o.smoothing)
        table = model.race.table(record, in_run, time.time()) if record.lanes else None
        if table is not None:
            race = RaceView(len(record.lanes), table, sharing(run.settings, run.cfg, record))
            start = model.race.start_time(record)
            if o.by_lane and start is not None:
                returns = model.lane_lines(table.rows, o.wall_axis, start)
        self.view = View(
            **base,
            task=run.cfg.task,
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
            + [f"lane {n} merged" for n in merging],
            source_ids=[-1, *range(run.settings.workers)] + [lane_source(n) for n in merging],
            source=showcase["source"],
            showcase_mode=showcase["mode"],
            race=race,
        )
