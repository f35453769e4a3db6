"""A worker's random stream survives a checkpoint: a compiled pack's (one stream for the pack, the
device's) and one saved on another kind of device."""

import torch
from conftest import tiny_config

from agent.agent import TDMPC2
from agent.noise import PackNoise

OBS, ACT = 5, 2
SEEDS = [1, 2]
CUDA_STATE_BYTES = 16  # a CUDA generator's state: Philox seed and offset


def _shared_pack(monkeypatch) -> TDMPC2:
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)  # the batched path, a GPU's
    agent = TDMPC2(tiny_config(), OBS, ACT, seeds=SEEDS)
    agent.noise = PackNoise(SEEDS, "cpu", shared=True)  # as a compiled pack draws
    return agent


def test_a_compiled_packs_stream_goes_on_after_a_resume(monkeypatch):
    before = _shared_pack(monkeypatch)
    before.noise.normal(4, 3)  # the run has drawn for a while before its checkpoint
    saved = [before.state_dict(k) for k in range(len(SEEDS))]
    expected = (before.noise.normal(4, 3), before.noise.uniform(5))

    resumed = _shared_pack(monkeypatch)  # a new process: its stream starts from the seed again
    for k, state in enumerate(saved):
        resumed.load_state_dict(state, worker=k)
    assert torch.equal(resumed.noise.normal(4, 3), expected[0])
    assert torch.equal(resumed.noise.uniform(5), expected[1])


def test_a_state_from_another_kind_of_device_loads_as_a_stream_of_its_own():
    state = TDMPC2(tiny_config(), OBS, ACT).state_dict()
    state["noise"] = torch.arange(CUDA_STATE_BYTES, dtype=torch.uint8)  # saved on a GPU
    loaded = [TDMPC2(tiny_config(), OBS, ACT) for _ in range(2)]
    for agent in loaded:
        agent.load_state_dict(state)  # no error: the run goes on
    fresh = TDMPC2(tiny_config(), OBS, ACT).noise.normal(8)
    draws = [agent.noise.normal(8) for agent in loaded]
    assert torch.equal(draws[0], draws[1])  # the same stream on every load of that state
    assert not torch.equal(draws[0], fresh)  # reseeded from it, not left at the start


def test_each_worker_draws_its_own_seeds_numbers_and_a_shared_stream_draws_for_all():
    noise = PackNoise([3, 4], "cpu")
    drawn = noise.normal(2, 5)
    assert drawn.shape == (2, 2, 5)
    for k, seed in enumerate((3, 4)):
        assert torch.equal(
            drawn[k], torch.randn(2, 5, generator=torch.Generator().manual_seed(seed))
        )
    alone = noise.member(1)
    assert alone.pack == 1 and alone.normal(3).shape == (1, 3)
    shared = PackNoise([3, 4], "cpu", shared=True)
    assert shared.normal(2, 5).shape == (2, 2, 5) and shared.uniform(4).shape == (2, 4)
