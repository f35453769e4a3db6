"""Mirrors of the metrics log for the tools researchers use: TensorBoard, Weights & Biases and
an `eval.csv` with the TD-MPC2 authors' columns.

The JSONL log stays the source of truth: RunDir.log writes each record there first and then
hands it to these sinks, which only copy what it holds. A sink that fails (a full disk, a
directory that cannot be written) says so once and is dropped; the run goes on.

The x axis of every exported curve is environment steps (agent steps x action repeat), the unit
of the published TD-MPC2 curves and of the authors' eval.csv.
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
from workers.rundir import RunDir

TB_DIR = "tb"
WANDB_PROJECT = "tdmpc2-live"
CSV_HEADER = "step,episode_reward\n"
# Record fields that are not curves (the rest of a "train" record is losses and rates).
_NOT_SCALARS = {"kind", "time", "step", "updates"}


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


def _number(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def scalars(record: dict) -> dict[str, float]:
    """The curves one metrics record holds, as TensorBoard tags (an empty dict for records
    that hold none, such as checkpoints and stops)."""
    kind, out = record.get("kind"), {}

    def put(tag: str, value: object) -> None:
        if (number := _number(value)) is not None:
            out[tag] = number

    if kind == "episode":
        put("episode/return", record.get("ret"))
        put("episode/length", record.get("length"))
    elif kind == "eval":
        put("eval/return", record.get("ret"))
    elif kind == "train":
        for name, value in record.items():
            if name not in _NOT_SCALARS:
                put(f"train/{name}", value)
        put("train/updates", record.get("updates"))
    elif kind == "merge":
        put("merge/ms", record.get("merge_ms"))
        put("merge/participants", len(record.get("participants", [])))
        put("merge/left_out", len(record.get("left_out", {})))
    elif kind == "knobs_applied":
        for name, value in (record.get("values") or {}).items():
            put(f"knobs/{name}", value)
    return out


class TensorBoardSink:
    """Writes the records' curves as TensorBoard scalars into one directory."""

    def __init__(self, log_dir: Path, cfg: Config, worker: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir, self.action_repeat, self.worker = log_dir, cfg.action_repeat, worker
        # Flushed every 10 s, so that TensorBoard follows a run that goes on.
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=10)
        self._writer.add_text("config", f"```\n{json.dumps(to_dict(cfg), indent=2)}\n```")

    def write(self, record: dict) -> None:
        values = scalars(record)
        if record.get("kind") == "merge" and self.worker is not None:
            distance = _number((record.get("distances") or {}).get(str(self.worker)))
            if distance is not None:  # this worker's distance from the mean before the merge
                values["merge/distance"] = distance
        step = _number(record.get("step"))
        if not values or step is None or self._writer is None:
            return
        env_step, wall = int(step) * self.action_repeat, _number(record.get("time"))
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, env_step, walltime=wall)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class EvalCsvSink:
    """The authors' eval.csv: `step` (env steps), `episode_reward` (mean evaluation return).
    Each line is one O_APPEND write, so a reader never sees half a line."""

    def __init__(self, path: Path, cfg: Config):
        self.path, self.action_repeat = path, cfg.action_repeat
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size == 0:  # a resumed run appends below its header
            os.write(self._fd, CSV_HEADER.encode())

    def write(self, record: dict) -> None:
        step, ret = _number(record.get("step")), _number(record.get("ret"))
        if record.get("kind") != "eval" or step is None or ret is None or self._fd is None:
            return
        os.write(self._fd, f"{int(step) * self.action_repeat},{ret!r}\n".encode())

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

    def write(self, record: dict) -> None:
        values, step = scalars(record), _number(record.get("step"))
        if values and step is not None and self._run is not None:
            self._run.log({**values, "env_step": int(step) * self.action_repeat})

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
        run_dir.sinks.append(EvalCsvSink(run_dir.path / f"eval{suffix}.csv", cfg))
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
