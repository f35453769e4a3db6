"""Merging backend: plain mean, bad workers left out, never waiting past the timeout."""

import threading
import time

import pytest
import torch

from agent.agent import TDMPC2
from workers.merging.files import FileMergeBackend, average_states, distance


def _state(value: float) -> dict:
    return {"w": torch.full((3, 2), value), "b": torch.full((2,), value * 2), "n": torch.tensor(7)}


def test_average_is_a_plain_mean():
    merged = average_states([_state(1.0), _state(2.0), _state(6.0)])
    assert torch.allclose(merged["w"], torch.full((3, 2), 3.0))
    assert torch.allclose(merged["b"], torch.full((2,), 6.0))
    assert merged["n"] == 7
    assert distance(_state(1.0), merged) == pytest.approx((6 * 4 + 2 * 16) ** 0.5)


def test_agents_weights_average_and_load(tiny_cfg):
    a, b = (
        TDMPC2(tiny_cfg, 5, 2),
        TDMPC2(tiny_cfg.__class__(**{**tiny_cfg.__dict__, "seed": 2}), 5, 2),
    )
    merged = average_states([a.model.state_dict(), b.model.state_dict()])
    a.model.load_state_dict(merged)
    key = "encoder.layers.0.weight"
    assert torch.allclose(a.model.state_dict()[key], merged[key])


def test_two_workers_merge_each_others_weights(tmp_path):
    backend = [FileMergeBackend(tmp_path, [0, 1], timeout_s=5) for _ in range(2)]
    results = {}

    def work(k):
        results[k] = backend[k].merge(k, 1, _state(float(k) * 4))

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in (0, 1):
        assert results[k].participants == [0, 1]
        assert torch.allclose(results[k].merged["w"], torch.full((3, 2), 2.0))
    assert (tmp_path / "merge" / "merged.pt").exists()


def test_dead_worker_is_left_out_after_the_timeout(tmp_path):
    backend = FileMergeBackend(tmp_path, [0, 1, 2], timeout_s=0.5)
    FileMergeBackend(tmp_path, [0, 1, 2]).publish(1, 3, _state(3.0))
    start = time.monotonic()
    result = backend.merge(0, 3, _state(1.0))
    assert time.monotonic() - start < 3
    assert result.participants == [0, 1]
    assert result.left_out == {2: "no weights yet"}
    assert torch.allclose(result.merged["w"], torch.full((3, 2), 2.0))


def test_non_finite_and_garbage_weights_never_poison_the_average(tmp_path):
    backend = FileMergeBackend(tmp_path, [0, 1, 2], timeout_s=0.2)
    FileMergeBackend(tmp_path, [0, 1, 2]).publish(1, 1, _state(float("nan")))
    (tmp_path / "merge" / "worker-2.pt").write_bytes(b"garbage, not a torch file")
    with pytest.warns(UserWarning, match="worker 2 left out"):
        result = backend.merge(0, 1, _state(5.0))
    assert result.participants == [0]
    assert result.left_out[1] == "non-finite weights"
    assert torch.isfinite(result.merged["w"]).all()
    assert backend.merge(0, 2, _state(float("inf"))) is None


def test_adam_moments_average_over_workers():
    # The merge-optimiser benchmark's "averaged moments" choice: each moment the workers' mean.
    from bench.run import _optimiser_moments

    states = []
    for grad in (1.0, 3.0):
        weight = torch.nn.Parameter(torch.zeros(3))
        optim = torch.optim.Adam([weight])
        weight.grad = torch.full((3,), grad)
        optim.step()
        states.append({"optim": optim.state_dict()})
    averaged = _optimiser_moments(states, "optim")["state"][0]
    first, second = (s["optim"]["state"][0] for s in states)
    for moment in ("exp_avg", "exp_avg_sq"):
        assert torch.allclose(averaged[moment], (first[moment] + second[moment]) / 2)
        assert not torch.allclose(averaged[moment], first[moment])


def test_a_pack_mean_weighs_as_many_workers_as_it_averages():
    # A pack's file holds the mean of its 3 workers: it counts 3 times against a lone worker.
    merged = average_states([_state(1.0), _state(5.0)], counts=[3, 1])
    assert torch.allclose(merged["w"], torch.full((3, 2), 2.0))
    merged = average_states([_state(5.0), _state(1.0)], counts=[1, 3])
    assert torch.allclose(merged["w"], torch.full((3, 2), 2.0))
    merged = average_states([_state(4.0), _state(1.0)], counts=[2, 1])
    assert torch.allclose(merged["w"], torch.full((3, 2), 3.0))


def test_weights_of_another_model_are_refused_and_huge_finite_weights_are_finite():
    from agent.errors import WeightsError
    from workers.merging.files import is_finite

    other = {**_state(1.0), "extra": torch.zeros(1)}
    with pytest.raises(WeightsError, match="different keys"):
        average_states([_state(1.0), other])
    with pytest.raises(WeightsError, match="different keys"):
        average_states([_state(1.0), _state(2.0), other])
    huge = {"w": torch.full((4,), 3e38)}  # finite; its float32 sum is not
    assert is_finite(huge) and not is_finite({"w": torch.tensor([1.0, float("nan")])})
