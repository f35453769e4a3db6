"""Replay buffer of whole episodes, sampled as slices of horizon+1 steps within one episode.

Storage is one ring of rows, like the reference: row i holds obs_i and the action and reward that
led to it (NaN in an episode's first row). A slice starting at row s is valid when rows s..s+H
belong to the same episode. A slice is drawn as the authors' sampler draws it: an episode
uniformly among those long enough, then a start uniformly inside it. Where every episode has the
same length (DMControl) that is uniform over transitions; where episodes end early (a
termination) a short episode weighs as much as a long one. Tensors live on the agent's device
when they fit.

Stacked frames (pixels: each observation the last `frames` frames) are kept once: a row holds
its observation's newest frame only, and a sample stacks each observation again from its row and
the rows before it in its episode (the first frame repeated at the start, as the env's reset
fills the stack), a third of the memory of storing stacks. A slice whose frames were
overwritten is not drawn.
"""

from __future__ import annotations

import torch

from agent.config import Config
from agent.errors import WeightsError
from agent.noise import set_generator_state
from agent.pixels import FRAMES

FORMAT = "tdmpc2-live/buffer/1"
CHUNK = 4096  # rows copied at a time when a loaded buffer is reordered


class EpisodeBuffer:
    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        action_dim: int,
        horizon: int,
        batch_size: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        frames: int = 1,
        dtype: torch.dtype = torch.float32,
    ):
        """`frames`: observations are that many frames stacked (obs_dim = frames x a frame's
        values), kept as `dtype` (pixels: uint8)."""
        self.capacity, self.horizon, self.batch_size = capacity, horizon, batch_size
        self.obs_dim, self.action_dim, self.frames = obs_dim, action_dim, frames
        self.device = torch.device(device)
        if obs_dim % frames:
            raise ValueError(f"{obs_dim} observation values are not {frames} equal frames")
        # one frame per row: the observation's newest
        self.obs = torch.zeros(capacity, obs_dim // frames, dtype=dtype, device=self.device)
        self.action = torch.zeros(capacity, action_dim, device=self.device)
        self.reward = torch.zeros(capacity, 1, device=self.device)
        self.terminated = torch.zeros(capacity, 1, device=self.device)
        # Episode id of each row; -1 marks an empty row.
        self.episode = torch.full((capacity,), -1, dtype=torch.long, device=self.device)
        # Each row's step within its episode: how far back its stack may reach.
        self.position = torch.zeros(capacity, dtype=torch.long, device=self.device)
        self.next_row = 0
        self.num_episodes = 0
        self.num_transitions = 0
        self._set_valid_starts()
        self._gen = torch.Generator(device=self.device).manual_seed(seed)

    @staticmethod
    def row_bytes(obs_dim: int, action_dim: int, frames: int = 1, obs_bytes: int = 4) -> int:
        """Bytes one stored step takes: its frame (or state), action, reward, termination flag,
        episode id and position, and its entry in the valid starts."""
        return obs_dim // frames * obs_bytes + 4 * action_dim + 4 + 4 + 8 + 8 + 8

    def __len__(self) -> int:
        """Transitions currently stored."""
        return self.num_transitions

    def add_episode(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        terminated: bool = False,
    ) -> None:
        """Store one episode: obs (T+1, D), action (T, A), reward (T,) or (T, 1)."""
        steps = action.shape[0]
        if obs.shape != (steps + 1, self.obs_dim) or action.shape[1] != self.action_dim:
            raise ValueError(
                f"episode shapes obs {tuple(obs.shape)} action {tuple(action.shape)} do not fit"
            )
        if steps + 1 > self.capacity:
            raise ValueError(
                f"an episode of {steps} steps does not fit a buffer of {self.capacity}"
            )
        frames = obs.reshape(steps + 1, self.frames, -1)
        if self.frames > 1 and not _is_frame_stack(frames):
            raise ValueError("the observations are not one episode's stacked frames")
        positions = torch.arange(steps + 1, device=self.device)
        rows = (self.next_row + positions) % self.capacity
        nan = torch.full((1, 1), float("nan"), device=self.device)
        self.obs[rows] = frames[:, -1].to(self.device, self.obs.dtype)
        self.position[rows] = positions
        self.action[rows] = torch.cat([nan.expand(1, self.action_dim), action.to(self.device)])
        self.reward[rows] = torch.cat([nan, reward.to(self.device).view(-1, 1).float()])
        term = torch.zeros(steps + 1, 1, device=self.device)
        term[-1] = float(terminated)
        self.terminated[rows] = term
        self.episode[rows] = self.num_episodes
        self.next_row = int(rows[-1] + 1) % self.capacity
        self.num_episodes += 1
        # Each stored episode (or surviving tail of an overwritten one) has one row without a
        # transition into it.
        filled = self.episode[self.episode >= 0]
        self.num_transitions = filled.numel() - filled.unique().numel()
        self._set_valid_starts()

    def _set_valid_starts(self) -> None:
        """The valid slice starts grouped by episode: `_starts` holds each sampleable
        episode's starts one after the other, `_first` and `_count` where its group begins and
        how long it is."""
        idx = torch.arange(self.capacity, device=self.device)
        # An episode's rows are one contiguous arc of the ring, its steps one after the other.
        # Equal ids at both ends of a slice are not enough: when the ring holds an episode and
        # a few rows of another, a slice can leave the episode at the ring's end and come back
        # into its first rows (steps 15, 13, 14, 0). Both ends in one episode H steps apart
        # means the slice runs forward inside it.
        end = (idx + self.horizon) % self.capacity
        same = self._apart(idx, end, self.horizon) & (self.episode[idx] >= 0)
        # ... and the frames its first observation stacks are still there, likewise
        back = self.position.clamp(max=self.frames - 1)
        same &= self._apart((idx - back) % self.capacity, idx, back)
        starts = idx[same]
        # Sorted by episode id (stable), an episode that wraps round the ring stays one group.
        ids, order = self.episode[starts].sort(stable=True)
        self._starts = starts[order]
        self._count = ids.unique_consecutive(return_counts=True)[1]
        self._first = self._count.cumsum(0) - self._count

    def _apart(self, rows: torch.Tensor, later: torch.Tensor, steps) -> torch.Tensor:
        """Whether each of `later` is `steps` steps after `rows` in the same episode."""
        same = self.episode[rows] == self.episode[later]
        return same & (self.position[later] - self.position[rows] == steps)

    def can_sample(self) -> bool:
        return self._starts.numel() > 0

    def sample(self, batch_size: int | None = None) -> tuple[torch.Tensor, ...]:
        """(obs (H+1,B,D), action (H,B,A), reward (H,B,1), terminated (H,B,1))."""
        if not self.can_sample():
            raise RuntimeError("the buffer holds no episode long enough to sample a slice")
        b = batch_size or self.batch_size
        episode = torch.randint(self._count.numel(), (b,), device=self.device, generator=self._gen)
        within = torch.rand(b, device=self.device, generator=self._gen) * self._count[episode]
        offset = within.long().clamp(max=self._count[episode] - 1)  # rand < 1, but float
        starts = self._starts[self._first[episode] + offset]
        rows = starts.unsqueeze(0) + torch.arange(self.horizon + 1, device=self.device)[:, None]
        rows = rows % self.capacity  # (H+1, B)
        acted = rows[1:]
        return self.stacked(rows), self.action[acted], self.reward[acted], self.terminated[acted]

    def stacked(self, rows: torch.Tensor) -> torch.Tensor:
        """The observations of `rows` (...,) as the env gave them (..., obs_dim): each row's
        frame after those of the `frames` - 1 rows before it, none from before its episode."""
        if self.frames == 1:
            return self.obs[rows]
        back = torch.arange(self.frames - 1, -1, -1, device=self.device)  # oldest first
        reach = torch.minimum(back, self.position[rows].unsqueeze(-1))
        frames = self.obs[(rows.unsqueeze(-1) - reach) % self.capacity]
        return frames.flatten(-2)

    # persistence -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "format": FORMAT,
            "capacity": self.capacity,
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "frames": self.frames,
            "obs": self.obs.cpu(),
            "position": self.position.cpu(),
            "action": self.action.cpu(),
            "reward": self.reward.cpu(),
            "terminated": self.terminated.cpu(),
            "episode": self.episode.cpu(),
            "next_row": self.next_row,
            "num_episodes": self.num_episodes,
            "num_transitions": self.num_transitions,
            "generator": self._gen.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise WeightsError("not a TD-MPC2 Live replay buffer (missing or unknown format tag)")
        dims = (state["obs_dim"], state["action_dim"], state.get("frames", 1))
        if dims != (self.obs_dim, self.action_dim, self.frames):
            raise WeightsError(
                f"buffer has obs/action dims and frames {dims}, expected "
                f"{(self.obs_dim, self.action_dim, self.frames)}"
            )
        if "position" not in state:  # saved before frames were stacked here: counted again
            state = {**state, "position": _positions(state["episode"], state["next_row"])}
        names = ("obs", "action", "reward", "terminated", "episode", "position")
        if state["capacity"] == self.capacity:
            for name in names:
                getattr(self, name).copy_(state[name])
            self.next_row = state["next_row"]
        else:
            # A run resumed with another capacity (more steps): keep the newest rows, in order.
            order = (state["next_row"] + torch.arange(state["capacity"])) % state["capacity"]
            order = order[state["episode"][order] >= 0][-self.capacity :]
            self.episode.fill_(-1)
            for name in names:  # in chunks: a copy of the saved frames would double them
                for at in range(0, len(order), CHUNK):
                    part = order[at : at + CHUNK]
                    getattr(self, name)[at : at + len(part)] = state[name][part].to(self.device)
            self.next_row = len(order) % self.capacity
        self.num_episodes = state["num_episodes"]
        filled = self.episode[self.episode >= 0]
        self.num_transitions = filled.numel() - filled.unique().numel()
        set_generator_state(self._gen, state["generator"])  # saved on another device: reseeded
        self._set_valid_starts()


def buffer_rows(cfg: Config) -> int:
    """A worker's buffer rows: room for its training steps (at most buffer_size) plus each
    episode's first row (no transition into it), and for one whole episode at least."""
    rows = min(cfg.buffer_size, cfg.steps) + cfg.steps // cfg.episode_length + cfg.num_envs
    return max(rows, cfg.episode_length + 1)


def frame_storage(cfg: Config) -> dict:
    """How a run's buffer keeps observations: pixels as single uint8 frames (EpisodeBuffer's
    `frames` and `dtype`), states as float32 vectors."""
    if cfg.obs == "rgb":
        return {"frames": FRAMES, "dtype": torch.uint8}
    return {}


def _positions(episode: torch.Tensor, next_row: int) -> torch.Tensor:
    """Each row's step within what the ring holds of its episode (saves without positions,
    frames 1): counted from the oldest row, where the ring resumes at `next_row`."""
    order = (next_row + torch.arange(episode.numel())) % episode.numel()
    ids = episode[order]
    new = torch.ones_like(ids, dtype=torch.bool)
    new[1:] = ids[1:] != ids[:-1]
    index = torch.arange(ids.numel())
    begins = torch.cummax(torch.where(new, index, 0), 0).values
    position = torch.zeros_like(episode)
    position[order] = index - begins
    return position


def _is_frame_stack(frames: torch.Tensor) -> bool:
    """Whether (T+1, F, D) observations are one episode's stacks: the first holds its first
    frame F times, and each later one drops the oldest frame of the one before."""
    first = (frames[0] == frames[0, -1:]).all()
    return bool(first and (frames[1:, :-1] == frames[:-1, 1:]).all())
