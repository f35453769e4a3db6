"""Mirrors of the metrics log for the tools researchers use: TensorBoard, Weights & Biases and
an `eval.csv` with the TD-MPC2 authors' columns.

The JSONL log stays the source of truth: RunDir.log writes each record there first and then
hands it to these sinks, which only copy what it holds. A sink that fails (a full disk, a
directory that cannot be written) says so once and is dropped; the run goes on.

The x axis of every exported curve is environment steps (agent steps x action repeat), the unit
of the published TD-MPC2 curves and of the authors' eval.csv.

In a race a worker's curves go where its lane's are (tb/lane-L/worker-K/,
eval-lane-L-worker-K.csv), from the knobs_applied record that put it in the lane on, so that
TensorBoard and the CSVs keep the lanes apart.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import netrc
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agent.config import Config, to_dict
from agent.errors import UserError
from workers.rundir.directory import RunDir
from workers.rundir.records import Episode, Eval, KnobsApplied, Merge, Record, Train

TB_DIR = "tb"
WANDB_PROJECT = "tdmpc2-live"
CSV_HEADER = "step,episode_reward\n"


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def tensorboard_available() -> bool:
    """True when TensorBoard's writer can be used (torch's SummaryWriter needs the package)."""
    return importlib.util.find_spec("tensorboard") is not None


def require_wandb() -> None:
    """Refuse --wandb up front, before anything is written, when the package is missing."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise UserError(
            "--wandb needs the wandb package: pip install 'tdmpc2-live[wandb]' (or pip install "
            "wandb), or leave out --wandb"
        ) from None


def scalars(record: Record) -> dict[str, float]:
    """The curves one metrics record holds, as TensorBoard tags (an empty dict for records
    that hold none, such as checkpoints and stops; values that are not finite left out)."""
    match record:
        case Episode():
            found = {"episode/return": record.ret, "episode/length": record.length}
        case Eval():
            found = {"eval/return": record.ret}
        case Train():
            found = {f"train/{name}": value for name, value in record.losses.items()}
            found.update({"train/steps_per_s": record.steps_per_s, "train/updates": record.updates})
        case Merge():
            found = {
                "merge/ms": record.merge_ms,
                "merge/participants": len(record.participants),
                "merge/left_out": len(record.left_out),
            }
        case KnobsApplied():
            found = {f"knobs/{name}": value for name, value in record.values.items()}
        case _:
            found = {}
    return {tag: float(v) for tag, v in found.items() if v is not None and math.isfinite(v)}


def moved_lane(record: Record, lane: int | None, worker: int | None) -> bool:
    """Whether `record` puts a worker of a multi-worker run in another lane than `lane`."""
    return isinstance(record, KnobsApplied) and record.lane != lane and worker is not None


class TensorBoardSink:
    """Writes the records' curves as TensorBoard scalars into one directory."""

    def __init__(self, log_dir: Path, cfg: Config, worker: int | None):
        self.log_dir, self.action_repeat, self.worker = log_dir, cfg.action_repeat, worker
        self.cfg, self.lane, self._writer = cfg, None, None
        self._open(log_dir)

    def _open(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.close()
        # Flushed every 10 s, so that TensorBoard follows a run that goes on.
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=10)
        self._writer.add_text("config", f"```\n{json.dumps(to_dict(self.cfg), indent=2)}\n```")

    def write(self, record: Record) -> None:
        if moved_lane(record, self.lane, self.worker):
            self.lane = record.lane
            tb = self.log_dir.parent  # tb/worker-K is where a worker's sink starts
            lane_dir = tb if record.lane is None else tb / f"lane-{record.lane}"
            self._open(lane_dir / f"worker-{self.worker}")
        values = scalars(record)
        if isinstance(record, Merge) and self.worker is not None:
            distance = record.distances.get(self.worker)
            if distance is not None and math.isfinite(distance):
                values["merge/distance"] = distance  # this worker's, from the mean before
        if not values or record.step is None or self._writer is None:
            return
        env_step = record.step * self.action_repeat
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, env_step, walltime=record.time)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class EvalCsvSink:
    """The authors' eval.csv: `step` (env steps), `episode_reward` (mean evaluation return).
    Each line is one O_APPEND write, so a reader never sees half a line."""

    def __init__(self, path: Path, cfg: Config, worker: int | None = None):
        self.path, self.action_repeat, self.worker = path, cfg.action_repeat, worker
        self.lane, self._fd = None, None
        self._open(path)

    def _open(self, path: Path) -> None:
        self.close()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size == 0:  # a resumed run appends below its header
            os.write(self._fd, CSV_HEADER.encode())

    def write(self, record: Record) -> None:
        if moved_lane(record, self.lane, self.worker):
            self.lane = record.lane
            lane = "" if record.lane is None else f"-lane-{record.lane}"
            self._open(self.path.parent / f"eval{lane}-worker-{self.worker}.csv")
        if not isinstance(record, Eval) or record.step is None or self._fd is None:
            return
        if not math.isfinite(record.ret):
            return
        os.write(self._fd, f"{record.step * self.action_repeat},{record.ret!r}\n".encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _wandb_logged_in() -> bool:
    """An API key in the environment or in ~/.netrc (where `wandb login` puts it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbSink:
    """One W&B run per writer (a worker's run is grouped with the others of its run directory);
    offline (synced later with `wandb sync`) unless logged in or WANDB_MODE says otherwise."""

    def __init__(self, run_dir: RunDir, cfg: Config, worker: int | None):
        import wandb

        self.action_repeat = cfg.action_repeat
        path = run_dir.path.resolve()
        name = path.name + ("" if worker is None else f"-worker-{worker}")
        # The same id on --resume continues the same W&B run.
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        run_id = re.sub(r"[^A-Za-z0-9_-]", "_", f"{name}-{digest}")[-100:]
        mode = None if os.environ.get("WANDB_MODE") or _wandb_logged_in() else "offline"
        self._run: Any = wandb.init(
            project=WANDB_PROJECT,
            name=name,
            group=path.name,
            id=run_id,
            resume="allow",
            dir=str(path),
            config=to_dict(cfg),
            mode=mode,
        )
        # Env steps as the x axis of every curve, logged as a value so that records written
        # again after a resume (steps that go back) are kept, not refused.
        self._run.define_metric("env_step")
        self._run.define_metric("*", step_metric="env_step")

    def write(self, record: Record) -> None:
        values = scalars(record)
        if values and record.step is not None and self._run is not None:
            self._run.log({**values, "env_step": record.step * self.action_repeat})

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def attach_exporters(
    run_dir: RunDir,
    cfg: Config,
    *,
    tensorboard: bool = True,
    wandb: bool = False,
    worker: int | None = None,
) -> None:
    """Add the exporters to `run_dir`, so that every record it logs is mirrored.

    A single run writes `tb/` and `eval.csv`; worker K of a multi-worker run `tb/worker-K/`
    (TensorBoard overlays the workers) and `eval-worker-K.csv`. TensorBoard is used when it is
    installed and `tensorboard` is true; a TensorBoard directory that cannot be written gets one
    warning line and the run goes on without it.
    """
    suffix = "" if worker is None else f"-worker-{worker}"
    try:
        run_dir.sinks.append(EvalCsvSink(run_dir.path / f"eval{suffix}.csv", cfg, worker))
    except OSError as err:
        warn(f"cannot write eval{suffix}.csv in {run_dir.path} ({err.strerror}); the run goes on")
    if tensorboard and tensorboard_available():
        log_dir = run_dir.path / TB_DIR / (f"worker-{worker}" if worker is not None else "")
        try:
            run_dir.sinks.append(TensorBoardSink(log_dir, cfg, worker))
        except OSError as err:
            warn(
                f"cannot write TensorBoard logs to {log_dir} ({err.strerror or err}); "
                "the run goes on without them"
            )
    if wandb:
        require_wandb()
        try:
            run_dir.sinks.append(WandbSink(run_dir, cfg, worker))
        except Exception as err:  # wandb raises its own kinds (network, settings, ...)
            warn(f"cannot start W&B logging ({type(err).__name__}: {err}); the run goes on")
