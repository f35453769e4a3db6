"""Which weights the showcase shows: the file of a source's newest weights, and loading them.

The merged weights (merge/merged.pt; before the first merge worker 0's checkpoint, else the
run's start weights, else the untrained model), a race lane's merged weights, or one worker's
newest weights (wherever its pool merges). Kept apart from the player's loop so the choice of
file can be tested without rendering.

A source is a number: -1 the merged weights, k >= 0 worker k's, -2 - L lane L's merged weights.
"""

from __future__ import annotations

from pathlib import Path

from agent.agent import TDMPC2
from agent.errors import WeightsError
from workers.rundir.directory import RunDir, load_state
from workers.rundir.paths import checkpoint_path, merge_dir, merged_path, start_path, weights_name
from workers.rundir.records import Error


def merged_file(run_path: Path) -> Path:
    return merged_path(run_path)


def lane_source(lane: int) -> int:
    """The source number of lane `lane`'s merged weights."""
    return -2 - lane


def worker_files(run_path: Path, worker: int) -> list[Path]:
    """Worker k's weights as it merged them last (in the run's pool or a lane's), and its last
    checkpoint."""
    merges = [merge_dir(run_path), *sorted(merge_dir(run_path).glob("lane-*"))]
    return [*(d / weights_name(worker) for d in merges), checkpoint_path(run_path, worker)]


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
    if source <= -2:
        path = merged_path(run_path, -2 - source)
        mtime = _mtime(path)
        return (path, mtime) if mtime is not None else None
    if source < 0:
        for path in (merged_file(run_path), checkpoint_path(run_path, 0), start_path(run_path)):
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


class ShownWeights:
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
            self.log.log(Error(message=f"showcase could not load {found[0]}: {err}"))
            if switched:  # never show another source's weights under this source's name
                self.agent.load_model_state(self.untrained, [0])
                self.round, self.step = -1, -1
