"""Finished episodes kept for the viewport's replay: the pose of every agent step (MuJoCo's qpos,
a few numbers each) and the rewards, so the showcase can draw an episode again at real speed
without planning.

Each worker keeps its newest training episode and the last episode of its newest evaluation,
one file each (`replays/worker-K.npz`, `replays/worker-K-eval.npz`), rewritten atomically when a
newer one ends: a latest-wins snapshot, like a frame. A run from before replays has no folder;
readers then find nothing and the viewport plays live.
"""

from __future__ import annotations

import io
import json
import math
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from workers.rundir.directory import atomic_write_bytes
from workers.rundir.paths import REPLAYS

KINDS = ("train", "eval")


@dataclass(frozen=True)
class EpisodeReplay:
    states: np.ndarray  # (T + 1, n): the pose after reset and after each of the T agent steps
    rewards: np.ndarray  # (T,)
    worker: int
    kind: str  # "train" or "eval"
    step: int  # the worker's agent step when the episode ended
    episode: int  # the worker's count of such episodes (1: its first)
    step_seconds: float  # simulated seconds per agent step: 1x replays one per this
    time: float = 0.0  # when it ended (time.time())

    @property
    def length(self) -> int:
        return len(self.rewards)

    @property
    def ret(self) -> float:
        return float(self.rewards.sum())

    def return_at(self, index: int) -> float:
        """The return of the first `index` agent steps (what the overlay shows at pose `index`)."""
        return float(self.rewards[: max(0, index)].sum())


def replay_path(run_path: str | Path, worker: int, kind: str = "train") -> Path:
    suffix = "" if kind == "train" else f"-{kind}"
    return Path(run_path) / REPLAYS / f"worker-{worker}{suffix}.npz"


def replay_bytes(replay: EpisodeReplay, pose_dtype: type = np.float64) -> bytes:
    """The episode as one .npz file's bytes (poses in `pose_dtype`: the album keeps float32)."""
    meta = dict(
        worker=replay.worker,
        phase=replay.kind,  # a record's kind is spelled in records.py only
        step=replay.step,
        episode=replay.episode,
        step_seconds=replay.step_seconds,
        time=replay.time or time.time(),
    )
    buffer = io.BytesIO()
    np.savez(
        buffer,
        states=np.asarray(replay.states, pose_dtype),
        rewards=np.asarray(replay.rewards, np.float32),
        meta=np.array(json.dumps(meta)),
    )
    return buffer.getvalue()


def write_replay(run_path: str | Path, replay: EpisodeReplay) -> None:
    """Replace the worker's kept episode of this kind with `replay` (atomically)."""
    path = replay_path(run_path, replay.worker, replay.kind)
    path.parent.mkdir(exist_ok=True)
    atomic_write_bytes(path, replay_bytes(replay))


MAX_REPLAY_BYTES = 256 << 20  # unpacked: a humanoid episode's poses are ~112 KB


def unpacked_bytes(path: str | Path) -> int:
    """What an .npz file's arrays take unpacked, read before any array is: the zip's sizes,
    and each array's own header no larger than its member (a small file from elsewhere
    cannot unpack, nor declare, an array of the window's whole memory). ValueError if not."""
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        for member in members:
            if member.filename.endswith(".npy"):
                with archive.open(member) as f:
                    headers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
                    read_header = headers.get(npy.read_magic(f))
                    if read_header is None:
                        raise ValueError(f"{member.filename}: an .npy version not written here")
                    shape, _, dtype = read_header(f)
                if math.prod(shape) * dtype.itemsize > member.file_size:
                    raise ValueError(f"{member.filename} declares more than it holds")
        return sum(member.file_size for member in members)


def read_replay(path: str | Path) -> EpisodeReplay | None:
    """The episode in `path`, or None when it is missing, damaged or would unpack to more
    than MAX_REPLAY_BYTES (a replay is best effort)."""
    try:
        if unpacked_bytes(path) > MAX_REPLAY_BYTES:
            return None
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            states, rewards = data["states"], data["rewards"]
        replay = EpisodeReplay(
            states=states,
            rewards=rewards,
            worker=int(meta["worker"]),
            kind=str(meta["phase"]),
            step=int(meta["step"]),
            episode=int(meta["episode"]),
            step_seconds=float(meta["step_seconds"]),
            time=float(meta["time"]),
        )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, MemoryError):
        return None
    if states.ndim != 2 or len(states) != len(rewards) + 1 or replay.step_seconds <= 0:
        return None
    return replay


def newest_replay(
    run_path: str | Path, workers: list[int] | None = None, kinds: tuple[str, ...] = KINDS
) -> Path | None:
    """The newest kept episode file of these workers (None: any) and kinds, by when it was
    written, or None when there is none."""
    folder = Path(run_path) / REPLAYS
    best: tuple[float, Path] | None = None
    try:
        paths = list(folder.glob("worker-*.npz"))
    except OSError:
        return None
    for path in paths:
        parts = path.stem.split("-")  # worker-K or worker-K-eval
        if len(parts) not in (2, 3) or not (parts[1].isascii() and parts[1].isdigit()):
            continue
        kind = parts[2] if len(parts) == 3 else "train"
        if kind not in kinds or (workers is not None and int(parts[1]) not in workers):
            continue
        try:
            mtime = path.stat().st_mtime
        except OSError:  # replaced while we looked
            continue
        if best is None or mtime > best[0]:
            best = (mtime, path)
    return None if best is None else best[1]
