"""The showcase's frame in shared memory: one process writes rendered frames, another reads them.

The player renders offscreen in its own process; the window needs its newest frame without a
pipe or a lock. Frames are a latest-wins snapshot guarded by a sequence counter (odd while a
frame is being written), so the reader never waits and never sees half a frame."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

# int64 header slots: sequence, height, width, then the frame info (INFO fields in order), the
# rest reserved so fields can be added without changing the layout of those before them; the
# last slot is the reader's: the sequence of the frame it took last.
HEADER = 48
PANE_FIELDS = ("worker", "replay", "step", "return", "lane")  # per pane; "replay" coded as below
MAX_PANES = 4
INFO = (
    "episode",
    "step",
    "weights_round",
    "return",
    "camera",
    "source",
    "weights_step",
    "pace",
    "renders",  # 0: the env draws no frames (a blank one stands in; the overlay says so)
    "replay",  # 0: live play; 1: a replay of a training episode, 2: of an evaluation episode
    "replay_worker",  # whose episode a replay shows
    "replay_return",  # the replayed episode's whole return (return: so far)
    "replay_length",  # its agent steps (step: the pose shown)
    "pinned",  # 1: the replay is an album episode the window pinned (it loops)
    "panes",  # 0 or 1: one view; 2-4: panes tiled in the frame (episodes.py's pane_boxes)
    *(f"pane{p}_{name}" for p in range(MAX_PANES) for name in PANE_FIELDS),
    "agent_view",  # 1: the agent's frames in a column beside the view (agent_view.py)
)
SCALED = ("return", "pace", "replay_return", *(f"pane{p}_return" for p in range(MAX_PANES)))
_INFO_AT = 3  # first info slot
_TAKEN = HEADER - 1
assert _INFO_AT + len(INFO) <= _TAKEN, "the frame info outgrew the header"


@dataclass(frozen=True)
class PaneInfo:
    """What one pane of a tiled frame replays."""

    worker: int = -1
    kind: int = 0  # 0: nothing (a blank pane), 1: a training episode, 2: an evaluation
    step: int = 0  # the worker's agent step when the episode ended
    ret: float = 0.0  # the episode's whole return
    lane: int = -1  # the race lane it stands for (-1: none)

    def values(self) -> tuple[int, ...]:
        return (self.worker, self.kind, self.step, int(self.ret * 1000), self.lane)


def pane_infos(info: dict) -> list[PaneInfo]:
    """The panes of a frame's info (read()'s dict); empty for a one-view frame."""
    count = info.get("panes", 0)
    if count < 2:
        return []
    return [PaneInfo(*(info[f"pane{p}_{name}"] for name in PANE_FIELDS)) for p in range(count)]


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
        renders: bool = True,
        replay: int = 0,
        replay_worker: int = -1,
        replay_return: float = 0.0,
        replay_length: int = 0,
        pinned: bool = False,
        panes: Sequence[PaneInfo] = (),
        agent_view: bool = False,
    ) -> None:
        """`panes`: what each pane shows when the frame is tiled (at most MAX_PANES);
        `agent_view`: the agent's frames are beside the view."""
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
            int(renders),
            replay,
            replay_worker,
            int(replay_return * 1000),
            replay_length,
            int(pinned),
            len(panes),
        )
        flat = [v for pane in panes[:MAX_PANES] for v in pane.values()]
        flat += [0] * (MAX_PANES * len(PANE_FIELDS) - len(flat))
        info += (*flat, int(agent_view))
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
        for name in SCALED:
            info[name] /= 1000
        info["sequence"] = seq
        return frame, info

    def close(self, unlink: bool = False) -> None:
        del self.header, self.pixels
        self.shm.close()
        if unlink:
            self.shm.unlink()
