"""The showcase's frame in shared memory: one process writes rendered frames, another reads them.

The player renders offscreen in its own process; the window needs its newest frame without a
pipe or a lock. Frames are a latest-wins snapshot guarded by a sequence counter (odd while a
frame is being written), so the reader never waits and never sees half a frame."""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np

# int64 header slots: sequence, height, width, then the frame info (INFO fields in order), the
# rest reserved so fields can be added without changing the layout of those before them; the
# last slot is the reader's: the sequence of the frame it took last.
HEADER = 24
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
)
SCALED = ("return", "pace", "replay_return")  # stored x 1000
_INFO_AT = 3  # first info slot
_TAKEN = HEADER - 1


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
            int(renders),
            replay,
            replay_worker,
            int(replay_return * 1000),
            replay_length,
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
        for name in SCALED:
            info[name] /= 1000
        info["sequence"] = seq
        return frame, info

    def close(self, unlink: bool = False) -> None:
        del self.header, self.pixels
        self.shm.close()
        if unlink:
            self.shm.unlink()
