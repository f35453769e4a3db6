import pytest
import torch

from agent.buffer import EpisodeBuffer
from agent.errors import WeightsError


def _episode(episode_id: int, steps: int, obs_dim=3, action_dim=2):
    # Every value carries its episode id and time step, so slices can be checked exactly.
    t = torch.arange(steps + 1, dtype=torch.float32)
    obs = torch.stack([torch.full_like(t, episode_id), t, t * 0], -1)[:, :obs_dim]
    action = torch.stack([torch.full((steps,), float(episode_id)), t[:-1]], -1)[:, :action_dim]
    reward = t[1:] + 1000 * episode_id
    return obs, action, reward


def test_slices_never_cross_episode_boundaries():
    buffer = EpisodeBuffer(200, 3, 2, horizon=3, batch_size=512)
    for i, length in enumerate([5, 2, 10, 4]):
        buffer.add_episode(*_episode(i, length))
    obs, action, reward, terminated = buffer.sample()
    assert obs.shape == (4, 512, 3) and action.shape == (3, 512, 2) and reward.shape == (3, 512, 1)
    assert (obs[:, :, 0] == obs[:1, :, 0]).all(), "a slice mixes episodes"
    assert (action[:, :, 0] == obs[:1, :, 0]).all()
    # obs t, then the action taken at t and the reward that followed it.
    assert (obs[1:, :, 1] == obs[:-1, :, 1] + 1).all()
    assert (action[:, :, 1] == obs[:-1, :, 1]).all()
    assert (reward[..., 0] == obs[1:, :, 1] + 1000 * obs[1:, :, 0]).all()
    assert not torch.isnan(action).any() and not torch.isnan(reward).any()
    assert len(buffer) == 5 + 2 + 10 + 4
    # Episode 1 (2 steps, 3 rows) is too short for a horizon-3 slice: it must never be sampled.
    assert not (obs[0, :, 0] == 1).any()


def test_ring_overwrites_oldest_episodes_and_stays_consistent():
    buffer = EpisodeBuffer(25, 3, 2, horizon=2, batch_size=256)
    for i in range(10):
        buffer.add_episode(*_episode(i, 6))
    obs, action, _, _ = buffer.sample()
    assert (obs[:, :, 0] == obs[:1, :, 0]).all()
    assert obs[0, :, 0].min() >= 6, "only the newest episodes survive"
    assert (obs[1:, :, 1] == obs[:-1, :, 1] + 1).all()
    assert len(buffer) <= 24


def test_save_and_load_round_trip():
    buffer = EpisodeBuffer(100, 3, 2, horizon=3, batch_size=8, seed=3)
    for i in range(4):
        buffer.add_episode(*_episode(i, 7))
    state = buffer.state_dict()
    copy = EpisodeBuffer(100, 3, 2, horizon=3, batch_size=8)
    copy.load_state_dict(state)
    assert len(copy) == len(buffer)
    for a, b in zip(buffer.sample(), copy.sample()):
        assert torch.equal(a, b)


def test_terminated_flag_marks_last_transition():
    buffer = EpisodeBuffer(50, 3, 2, horizon=1, batch_size=256)
    buffer.add_episode(*_episode(0, 4), terminated=True)
    obs, _, _, terminated = buffer.sample()
    last = obs[1, :, 1] == 4
    assert (terminated[0, last] == 1).all() and (terminated[0, ~last] == 0).all()


def test_load_into_another_capacity_keeps_newest_whole_slices():
    small = EpisodeBuffer(25, 3, 2, horizon=2, batch_size=256)
    for i in range(10):
        small.add_episode(*_episode(i, 6))
    for capacity in (100, 15):
        other = EpisodeBuffer(capacity, 3, 2, horizon=2, batch_size=256)
        other.load_state_dict(small.state_dict())
        obs, action, _, _ = other.sample()
        assert (obs[:, :, 0] == obs[:1, :, 0]).all()
        assert (obs[1:, :, 1] == obs[:-1, :, 1] + 1).all()
        assert obs[0, :, 0].max() == 9
        other.add_episode(*_episode(10, 6))
        assert other.sample()[0][0, :, 0].max() == 10


def test_a_buffer_saved_on_another_kind_of_device_loads_and_samples():
    def filled():
        buffer = EpisodeBuffer(100, 3, 2, horizon=3, batch_size=8, seed=3)
        for i in range(4):
            buffer.add_episode(*_episode(i, 10))
        return buffer

    state = filled().state_dict()
    state["generator"] = torch.arange(16, dtype=torch.uint8)  # a CUDA generator's state
    loaded = [filled() for _ in range(2)]
    for buffer in loaded:
        buffer.load_state_dict(state)  # no error: the run goes on
    first, second = (buffer.sample()[0] for buffer in loaded)
    assert torch.equal(first, second)  # the same stream on every load of that state
    assert not torch.equal(first, filled().sample()[0])  # reseeded from it


def test_a_sample_is_horizon_plus_one_observations_and_horizon_of_the_rest():
    buffer = EpisodeBuffer(60, 3, 2, horizon=3, batch_size=5)
    buffer.add_episode(*_episode(0, 9), terminated=True)
    shapes = [tuple(x.shape) for x in buffer.sample()]
    assert shapes == [(4, 5, 3), (3, 5, 2), (3, 5, 1), (3, 5, 1)]
    assert buffer.sample(7)[0].shape == (4, 7, 3)  # a batch size of the call's own


def test_a_state_without_the_format_tag_is_refused():
    buffer = EpisodeBuffer(60, 3, 2, horizon=3, batch_size=5)
    state = buffer.state_dict()
    for bad in ({k: v for k, v in state.items() if k != "format"}, [1, 2]):
        with pytest.raises(WeightsError, match="replay buffer"):
            buffer.load_state_dict(bad)


def test_a_larger_buffer_loads_every_episode_from_the_first():
    small = EpisodeBuffer(30, 3, 2, horizon=2, batch_size=512)
    for i in range(3):
        small.add_episode(*_episode(i, 6))  # 21 rows: nothing overwritten
    other = EpisodeBuffer(100, 3, 2, horizon=2, batch_size=512)
    other.load_state_dict(small.state_dict())
    assert len(other) == len(small) == 18
    assert set(other.sample()[0][0, :, 0].tolist()) == {0.0, 1.0, 2.0}
    assert other.next_row == 21


def test_an_empty_buffer_holds_nothing_and_fills_from_row_zero():
    buffer = EpisodeBuffer(60, 3, 2, horizon=3, batch_size=5)
    assert len(buffer) == 0 and not buffer.can_sample()
    with pytest.raises(RuntimeError, match="no episode long enough"):
        buffer.sample()
    obs, action, reward = _episode(0, 4)
    buffer.add_episode(obs, action, reward)
    assert len(buffer) == 4 and buffer.next_row == 5
    assert torch.equal(buffer.obs[:5], obs) and (buffer.episode[5:] < 0).all()


def test_an_episode_fits_when_its_rows_fit_and_has_the_buffers_shapes():
    buffer = EpisodeBuffer(10, 3, 2, horizon=2, batch_size=4)
    obs, action, reward = _episode(0, 9)  # 10 rows: exactly the capacity
    buffer.add_episode(obs, action, reward)
    assert len(buffer) == 9 and not buffer.terminated.any()  # not terminated unless said
    shortest = EpisodeBuffer(20, 3, 2, horizon=3, batch_size=4)
    shortest.add_episode(*_episode(0, 3))  # one slice: rows 0..3
    assert shortest.can_sample() and (shortest.sample()[0][:, :, 1].T == torch.arange(4)).all()
    with pytest.raises(ValueError, match="does not fit"):
        buffer.add_episode(*_episode(1, 10))
    with pytest.raises(ValueError, match="do not fit"):
        buffer.add_episode(obs[:, :2], action, reward)  # the observations' width alone is off


def test_an_episode_is_drawn_uniformly_then_a_start_inside_it():
    """The authors' sampler: one long episode among many short ones (terminated early) is
    drawn as often as each short one, not in proportion to its transitions."""
    buffer = EpisodeBuffer(400, 3, 2, horizon=3, batch_size=20_000, seed=1)
    buffer.add_episode(*_episode(0, 200))
    for i in range(1, 10):
        buffer.add_episode(*_episode(i, 5), terminated=True)
    obs = buffer.sample()[0]
    shares = torch.bincount(obs[0, :, 0].long(), minlength=10) / obs.shape[1]
    # 1/10 each (by transitions the long episode would take 197 of 215 starts: 0.92).
    assert torch.allclose(shares, torch.full((10,), 0.1), atol=0.015), shares
    # Inside the long episode every start is as likely as the others (197 of them).
    starts = obs[0, obs[0, :, 0] == 0, 1].long()
    assert starts.min() == 0 and starts.max() == 200 - 3
    assert torch.bincount(starts).float().std() < 0.5 * starts.numel() / 197


def test_an_episode_that_wraps_round_the_ring_is_one_episode():
    buffer = EpisodeBuffer(30, 3, 2, horizon=2, batch_size=6000, seed=2)
    for i, length in enumerate([10, 10, 12]):  # the third wraps: rows 22..29 and 0..4
        buffer.add_episode(*_episode(i, length))
    obs = buffer.sample()[0]
    assert (obs[:, :, 0] == obs[:1, :, 0]).all() and (obs[1:, :, 1] == obs[:-1, :, 1] + 1).all()
    shares = torch.bincount(obs[0, :, 0].long()) / obs.shape[1]
    # Episode 0 lost its first rows to the wrap; the other two (and what is left of it) are
    # drawn equally.
    assert torch.allclose(shares, torch.full_like(shares, 1 / len(shares)), atol=0.03), shares


# stacked frames (pixels) -------------------------------------------------------------------------
def _stacked_episode(episode_id: int, steps: int, frame_dim=4, frames=3):
    """An episode of stacked frames as the env gives them: frame t of episode e is filled with
    e * 20 + t; the first observation repeats the first frame."""
    seen = [
        torch.full((frame_dim,), episode_id * 20 + t, dtype=torch.uint8) for t in range(steps + 1)
    ]
    obs = torch.stack(
        [
            torch.cat([seen[max(0, t - back)] for back in range(frames - 1, -1, -1)])
            for t in range(steps + 1)
        ]
    )
    action = torch.zeros(steps, 1)
    return obs, action, torch.arange(steps, dtype=torch.float32)


def test_stacked_frames_are_kept_once_and_stacked_again_at_sampling():
    buffer = EpisodeBuffer(200, 12, 1, horizon=3, batch_size=2048, frames=3, dtype=torch.uint8)
    episodes = {i: _stacked_episode(i, n) for i, n in enumerate([6, 3, 9, 4])}
    for obs, action, reward in episodes.values():
        buffer.add_episode(obs, action, reward)
    assert buffer.obs.shape == (200, 4) and buffer.obs.dtype == torch.uint8  # a frame per row
    obs, _, reward, _ = buffer.sample()
    assert obs.shape == (4, 2048, 12) and obs.dtype == torch.uint8
    # every sampled observation is exactly the env's at that step (rewards here count steps)
    steps = torch.cat([reward[:1, :, 0] - 0, reward[:, :, 0] + 1]).long()  # step of each row
    episode = obs[0, :, -1].long() // 20
    for t in range(4):
        for b in range(0, 2048, 7):
            expected = episodes[int(episode[b])][0][int(steps[t, b])]
            assert torch.equal(obs[t, b], expected)
    # starts near an episode's beginning repeat its first frame, never the episode before's
    first = obs[0][steps[0] == 0].view(-1, 3, 4)
    assert len(first) and (first == first[:, 2:]).all()
    assert (obs.view(4, 2048, 3, 4) // 20 == episode.view(1, -1, 1, 1)).all(), "across a boundary"


def test_a_slice_whose_first_frames_were_overwritten_is_not_drawn():
    # 10 rows: the second 7-row episode overwrites the first's head; the first's tail keeps
    # rows whose stacks would reach into overwritten rows.
    buffer = EpisodeBuffer(10, 12, 1, horizon=1, batch_size=4096, frames=3, dtype=torch.uint8)
    buffer.add_episode(*_stacked_episode(0, 6))
    buffer.add_episode(*_stacked_episode(1, 6))  # rows 7..9, 0..3: episode 0 keeps rows 4..6
    obs, _, _, _ = buffer.sample()
    old = obs[0, :, -1] < 20
    # episode 0's surviving rows are its steps 4, 5, 6: a start at 4 or 5 stacks steps 2-5,
    # rows 2 and 3 now episode 1's; none of its slices may be drawn
    assert not old.any()
    state = buffer.state_dict()
    copy = EpisodeBuffer(10, 12, 1, horizon=1, batch_size=8, frames=3, dtype=torch.uint8)
    copy.load_state_dict(state)
    assert torch.equal(copy.position, buffer.position) and torch.equal(copy.obs, buffer.obs)


def test_observations_that_are_not_a_frame_stack_are_refused():
    buffer = EpisodeBuffer(50, 12, 1, horizon=1, batch_size=8, frames=3, dtype=torch.uint8)
    obs, action, reward = _stacked_episode(0, 5)
    broken = obs.clone()
    broken[3, :4] += 1  # its oldest frame is not the frame before's middle one
    with pytest.raises(ValueError, match="stacked frames"):
        buffer.add_episode(broken, action, reward)
    with pytest.raises(WeightsError, match="frames"):
        EpisodeBuffer(50, 12, 1, horizon=1, batch_size=8).load_state_dict(buffer.state_dict())


def test_a_stored_pixel_step_takes_a_third_of_a_stacked_one():
    stacked = EpisodeBuffer.row_bytes(9 * 64 * 64, 6, frames=1, obs_bytes=1)
    single = EpisodeBuffer.row_bytes(9 * 64 * 64, 6, frames=3, obs_bytes=1)
    assert stacked - single == 2 * 64 * 64 * 3  # two frames of 64x64 RGB fewer a step
    buffer = EpisodeBuffer(
        100, 9 * 64 * 64, 6, horizon=3, batch_size=8, frames=3, dtype=torch.uint8
    )
    held = sum(t.numel() * t.element_size() for t in (buffer.obs, buffer.action, buffer.reward))
    held += sum(
        t.numel() * t.element_size() for t in (buffer.terminated, buffer.episode, buffer.position)
    )
    assert held == 100 * (single - 8)  # all but the valid starts' index, which grows as it fills


def test_a_buffer_saved_before_frames_were_stacked_here_still_loads():
    buffer = EpisodeBuffer(100, 3, 2, horizon=3, batch_size=8, seed=3)
    for i in range(3):
        buffer.add_episode(*_episode(i, 7))
    old = {k: v for k, v in buffer.state_dict().items() if k not in ("frames", "position")}
    copy = EpisodeBuffer(100, 3, 2, horizon=3, batch_size=8)
    copy.load_state_dict(old)
    assert len(copy) == len(buffer)
    for a, b in zip(buffer.sample(), copy.sample()):
        assert torch.equal(a, b)


def test_a_runs_buffer_holds_its_steps_and_each_episodes_first_row():
    from agent.buffer import buffer_rows, frame_storage
    from agent.config import make_config

    cfg = make_config(1, steps=10_000, buffer_size=1_000_000, episode_length=500, num_envs=2)
    assert buffer_rows(cfg) == 10_000 + 20 + 2  # the steps, a first row per episode, per env
    small = make_config(1, steps=10_000, buffer_size=3_000, episode_length=500)
    assert buffer_rows(small) == 3_000 + 20 + 1
    short = make_config(1, steps=10, episode_length=500)
    assert buffer_rows(short) == 501  # room for one whole episode
    assert frame_storage(make_config(1, obs="rgb")) == {"frames": 3, "dtype": torch.uint8}
    assert frame_storage(make_config(1)) == {}


@pytest.mark.parametrize("frames", [1, 3])
def test_slices_stay_in_one_episode_after_a_load_into_any_capacity(frames):
    # Saved with 23 rows: 7 of episode 0 (15 rows), then episode 1 (16 rows) wrapped round.
    # Loaded into 18 rows, the ring holds 2 rows of episode 0 and all of episode 1: a slice
    # from episode 1's last row once ran through them into its first (steps 15, 13, 14, 0),
    # and a stack reached across. A buffer filled at each capacity must hold the same.
    episodes = [_stacked_episode(i, n, frames=frames) for i, n in enumerate([14, 15])]
    first, second = episodes[0][0], episodes[1][0]  # (episode, step): the observation
    env = torch.stack([torch.cat([first, first[-1:]]), second])  # (a step 15 never drawn)
    kind = {"frames": frames, "dtype": torch.uint8}
    saved = EpisodeBuffer(23, 4 * frames, 1, horizon=3, batch_size=8, **kind)
    for episode in episodes:
        saved.add_episode(*episode)
    for capacity in range(17, 41):
        loaded = EpisodeBuffer(capacity, 4 * frames, 1, horizon=3, batch_size=2000, **kind)
        loaded.load_state_dict(saved.state_dict())
        filled = EpisodeBuffer(capacity, 4 * frames, 1, horizon=3, batch_size=2000, **kind)
        for episode in episodes:
            filled.add_episode(*episode)
        for buffer in (loaded, filled):
            obs, _, reward, _ = buffer.sample()
            newest = obs[..., -1].long()  # frame of episode e at step t holds e * 20 + t
            episode, step = newest // 20, newest % 20
            assert (episode == episode[:1]).all(), f"a slice crosses episodes at {capacity}"
            assert (step[1:] == step[:-1] + 1).all(), f"steps out of order at {capacity}"
            assert (reward[..., 0] == step[:-1]).all()  # the reward of the step from each
            assert (episode[0] == 1).any() and obs.shape[1] == 2000
            # every observation is the env's, its stack included
            assert torch.equal(obs, env[episode, step]), f"a wrong stack at {capacity}"
