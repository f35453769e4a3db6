"""The self-check's decision (agent/self_check.py) with fake fast paths: one that raises at
capture, one whose loss is perturbed, one whose graph replays a stale input; each ends on the
right fallback with a line that says why. And the tolerances: each one fails just past its
bound (a tolerance that cannot fail would pass a broken path)."""

import math

import pytest
import torch

from agent.self_check import (
    BF16,
    FLOAT32,
    PLAIN,
    TF32,
    FastPath,
    Outputs,
    Tolerance,
    compare,
    decide,
    ladder,
    tolerance,
)

GRAPHS = FastPath("graphs", pack=2)
COMPILE = FastPath("compile", pack=2)
EAGER_PACK = FastPath("eager", pack=2)
SPLIT = FastPath(pack=2, split=True)
CPU_PACK = FastPath("eager", pack=2, threads=True, bf16=True)


def outputs(seed: int = 0, workers: int = 2) -> Outputs:
    """What an update and a plan give for one batch (`seed`), for `workers` workers."""
    g = torch.Generator().manual_seed(seed)
    return Outputs(
        losses={
            "total_loss": 10 + torch.rand(workers, generator=g),
            "pi_loss": torch.rand(workers, generator=g) - 0.5,
            "grad_norm": 5 + torch.rand(workers, generator=g),
        },
        delta={
            "w": torch.randn(workers, 6, 4, generator=g) * 3e-4,
            "b": torch.randn(workers, 4, generator=g) * 3e-4,
        },
        action=torch.rand(workers, 2, 3, generator=g) * 2 - 1,
        mean=torch.rand(workers, 2, 3, 3, generator=g) * 2 - 1,
    )


class FakeProbe:
    """Fast paths that go wrong as asked: "raise" (at capture), "perturb" (the total loss
    1.1x), "stale" (the outputs of the batch before), anything else agrees exactly."""

    def __init__(self, faults: dict[FastPath, str], compile_seconds: float = 0.0):
        self.faults, self.compile_seconds, self.asked = faults, compile_seconds, []

    def pair(self, path: FastPath) -> tuple[Outputs, Outputs]:
        self.asked.append(path)
        fault = self.faults.get(path)
        reference = outputs(3)
        if fault == "raise":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        if fault == "perturb":
            fast = outputs(3)
            fast.losses["total_loss"] = fast.losses["total_loss"] * 1.1
            return fast, reference
        if fault == "stale":
            return outputs(2), reference
        return outputs(3), reference


def test_a_fast_path_that_raises_at_capture_falls_back_to_compile_without_graphs():
    verdict = decide(ladder(GRAPHS), FakeProbe({GRAPHS: "raise"}))
    assert verdict.path == COMPILE and verdict.sound
    assert [(t.path, t.outcome) for t in verdict.trials] == [
        (GRAPHS, "raised"),
        (COMPILE, "agrees"),
    ]
    line = verdict.line()
    assert line.startswith("fast path: compiled without CUDA graphs, a pack of 2, float32 (the")
    assert "): graphs raised RuntimeError: CUDA error: operation not permitted when " in line
    assert "; compile agrees with the plain path (largest gap 0% of allowed)" in line
    assert "more" not in line  # the error's first line only


def test_a_perturbed_loss_falls_back_and_names_the_loss():
    probe = FakeProbe({GRAPHS: "perturb", COMPILE: "perturb"})
    verdict = decide(ladder(GRAPHS), probe)
    assert verdict.path == EAGER_PACK
    assert [t.outcome for t in verdict.trials] == ["disagrees", "disagrees", "agrees"]
    assert "total_loss of worker" in verdict.trials[0].detail
    assert "disagrees: total_loss of worker" in verdict.line()
    # The eager pack was checked once, as the compiled paths' reference, and then trusted.
    assert probe.asked == [EAGER_PACK, GRAPHS, COMPILE]


def test_a_graph_that_replays_a_stale_input_falls_back():
    verdict = decide(ladder(GRAPHS), FakeProbe({GRAPHS: "stale"}))
    assert verdict.path == COMPILE
    assert verdict.trials[0].outcome == "disagrees" and verdict.trials[0].worst > 10


def test_a_pack_whose_eager_version_disagrees_goes_to_one_process_per_worker():
    probe = FakeProbe({EAGER_PACK: "stale"})
    verdict = decide(ladder(GRAPHS), probe)
    assert verdict.path == SPLIT and verdict.sound
    assert [t.outcome for t in verdict.trials] == ["disagrees", "disagrees", "disagrees", "split"]
    assert all(t.detail.startswith("its eager version: ") for t in verdict.trials[:2])
    assert probe.asked == [EAGER_PACK]  # as the compiled paths' reference, and as a rung
    line = verdict.line()
    assert line.startswith("fast path: one process per worker (the self-check's choice): graphs")
    assert "; each worker goes on in a process of its own and checks its own path (self" in line


def test_a_cpu_pack_drops_bf16_then_splits():
    f32 = FastPath("eager", pack=2, threads=True)
    verdict = decide(ladder(CPU_PACK), FakeProbe({CPU_PACK: "raise"}))
    assert verdict.path == f32
    verdict = decide(ladder(CPU_PACK), FakeProbe({CPU_PACK: "perturb", f32: "stale"}))
    assert verdict.path == SPLIT


def test_a_lone_worker_that_fails_everything_trains_on_the_plain_path():
    lone = FastPath("graphs")
    faults = {lone: "raise", FastPath("compile"): "stale"}
    verdict = decide(ladder(lone), FakeProbe(faults))
    assert verdict.path == PLAIN and verdict.sound
    assert verdict.trials[-1].outcome == "plain"
    assert "; eager float32 is the plain path (nothing to compare)" in verdict.line()


def test_the_plain_path_itself_is_not_compared():
    probe = FakeProbe({})
    verdict = decide(ladder(PLAIN), probe)
    assert verdict.path == PLAIN and probe.asked == []


def test_a_path_chosen_by_hand_is_kept_and_the_line_says_it_disagrees():
    verdict = decide(ladder(GRAPHS, by_hand=True), FakeProbe({GRAPHS: "perturb"}), by_hand=True)
    assert verdict.path == GRAPHS and not verdict.sound
    line = verdict.line()
    assert line.startswith("fast path: compiled with CUDA graphs, a pack of 2, float32 (chosen by")
    assert "; kept as asked (--fast-path auto lets the check fall back) (self-check" in line
    verdict = decide([GRAPHS], FakeProbe({EAGER_PACK: "perturb"}), by_hand=True)
    assert verdict.path == GRAPHS and verdict.trials[0].detail.startswith("its eager version")


def test_without_a_split_a_pack_that_fails_everything_is_not_sound():
    verdict = decide(ladder(GRAPHS, can_split=False), FakeProbe({EAGER_PACK: "perturb"}))
    assert verdict.path == EAGER_PACK and not verdict.sound
    line = verdict.line()
    assert line.startswith("fast path: eager, a pack of 2, float32 (the self-check's choice): ")
    assert "; nothing simpler to fall back to (self-check" in line


def test_the_verdict_times_the_check_and_its_compiling():
    ticks = iter([100.0, 104.5])
    verdict = decide(ladder(GRAPHS), FakeProbe({}, compile_seconds=3.25), clock=lambda: next(ticks))
    assert (verdict.seconds, verdict.compile_seconds) == (4.5, 3.25)
    assert verdict.line().endswith("(self-check 4.5 s, 3.2 s of it compiling)")


def test_the_ladders_fastest_first():
    assert ladder(GRAPHS) == [GRAPHS, COMPILE, EAGER_PACK, SPLIT]
    assert ladder(GRAPHS, can_split=False) == [GRAPHS, COMPILE, EAGER_PACK]
    assert ladder(FastPath("graphs")) == [FastPath("graphs"), FastPath("compile"), PLAIN]
    assert ladder(CPU_PACK) == [CPU_PACK, FastPath("eager", 2, threads=True), SPLIT]
    assert ladder(FastPath(bf16=True)) == [FastPath(bf16=True), PLAIN]
    assert ladder(CPU_PACK, by_hand=True) == [CPU_PACK]
    assert tolerance(CPU_PACK) is BF16 and tolerance(GRAPHS) is FLOAT32


def test_fast_paths_describe_themselves_and_refuse_unknown_modes():
    assert CPU_PACK.describe() == "eager, a pack of 2 on threads, bf16"
    assert GRAPHS.base == EAGER_PACK and EAGER_PACK.base is None
    assert FastPath("graphs", 2, threads=True).base == EAGER_PACK  # a batched pack
    assert PLAIN.plain and not FastPath(bf16=True).plain and not SPLIT.plain
    with pytest.raises(ValueError, match="no fast path 'auto'"):
        FastPath("auto")


# the tolerances --------------------------------------------------------------------------
def _moved(base: Outputs, **changes) -> Outputs:
    out = Outputs(
        {k: v.clone() for k, v in base.losses.items()},
        {k: v.clone() for k, v in base.delta.items()},
        base.action.clone(),
        base.mean.clone(),
    )
    for name, fn in changes.items():
        setattr(out, name, fn(getattr(out, name)))
    return out


@pytest.mark.parametrize("tol", [FLOAT32, TF32, BF16], ids=["float32", "tf32", "bf16"])
@pytest.mark.parametrize("loss", ["total_loss", "pi_loss"])
def test_a_loss_fails_just_past_its_tolerance(tol: Tolerance, loss: str):
    plain = outputs()
    reference = float(plain.losses[loss][1])
    allowed = tol.loss_atol + tol.loss_rtol * abs(reference)
    for factor, agrees in ((0.98, True), (1.02, False)):

        def shift(losses, factor=factor):
            losses[loss][1] += factor * allowed
            return losses

        found = compare(_moved(plain, losses=shift), plain, tol)
        assert found.agrees == agrees, (factor, found)
    assert f"{loss} of worker 1" in found.detail


@pytest.mark.parametrize("tol", [FLOAT32, TF32, BF16], ids=["float32", "tf32", "bf16"])
def test_each_workers_weight_change_fails_just_past_its_tolerance(tol: Tolerance):
    plain = outputs()
    for factor, agrees in ((0.98, True), (1.02, False)):

        def scale(delta, factor=factor):  # worker 0's change (1 + f * tol) times the plain one
            return {
                k: torch.cat([v[:1] * (1 + factor * tol.weights), v[1:]]) for k, v in delta.items()
            }

        found = compare(_moved(plain, delta=scale), plain, tol)
        assert found.agrees == agrees, (factor, found)
    assert found.detail.startswith("weights' change of worker 0")


@pytest.mark.parametrize("tol", [FLOAT32, TF32, BF16], ids=["float32", "tf32", "bf16"])
def test_the_plan_mean_fails_just_past_its_tolerance_and_the_action_where_compared(tol):
    plain = outputs()
    for part, allowed in (("mean", tol.mean), ("action", tol.action)):
        for factor in (0.98, 1.02):

            def nudge(x, factor=factor, allowed=allowed):
                x = x.clone()
                x[1, 0, 0] += factor * (allowed or 1.0)
                return x

            found = compare(_moved(plain, **{part: nudge}), plain, tol)
            expected = factor < 1 or allowed is None  # bf16, TF32: the action is not compared
            assert found.agrees == expected, (part, factor, found)
    assert tol.action is not None or BF16.action is None


def test_a_value_that_is_not_finite_or_missing_disagrees():
    plain = outputs()
    for bad in (math.nan, math.inf):

        def spoil(losses, bad=bad):
            losses["grad_norm"][0] = bad
            return losses

        found = compare(_moved(plain, losses=spoil), plain, BF16)
        assert not found.agrees and found.worst == math.inf and "grad_norm" in found.detail
    fast = _moved(plain)
    del fast.losses["pi_loss"]
    found = compare(fast, plain, BF16)
    assert not found.agrees and "pi_loss is missing" in found.detail
    nan_mean = _moved(plain, mean=lambda m: m.fill_(math.nan))
    assert not compare(nan_mean, plain, BF16).agrees


def test_identical_outputs_agree_with_no_gap_and_a_stale_batch_is_far_off():
    plain = outputs()
    found = compare(_moved(plain), plain, FLOAT32)
    assert found.agrees and found.worst == 0.0
    # Another batch's outputs: far outside even bf16's bounds.
    assert compare(outputs(1), plain, BF16).worst > 3


def test_lone_workers_outputs_join_as_a_packs():
    a, b = outputs(0, workers=1), outputs(1, workers=1)
    both = Outputs.join([a, b])
    assert both.action.shape == (2, 2, 3)
    assert torch.equal(
        both.losses["pi_loss"], torch.cat([a.losses["pi_loss"], b.losses["pi_loss"]])
    )
    assert torch.equal(both.delta["w"][1], b.delta["w"][0])
    assert torch.equal(both.mean[0], a.mean[0])


class RaisingProbe:
    compile_seconds = 0.0

    def __init__(self, error: Exception):
        self.error = error

    def pair(self, path):
        raise self.error


def test_what_a_raising_path_says_its_errors_first_line_at_most_200_characters():
    def raised(error):
        (trial,) = decide([FastPath(bf16=True)], RaisingProbe(error), by_hand=True).trials
        assert trial.outcome == "raised" and trial.worst == math.inf
        return trial.detail

    assert raised(RuntimeError()) == "RuntimeError"
    assert raised(RuntimeError("  \n")) == "RuntimeError"
    assert raised(ValueError(": x:")) == "ValueError: : x:"
    assert raised(RuntimeError("a" * 300 + "\nsecond")) == "RuntimeError: " + "a" * 200


def test_a_compiled_path_failed_by_its_eager_version_carries_that_gap():
    verdict = decide([GRAPHS], FakeProbe({EAGER_PACK: "stale"}), by_hand=True)
    (trial,) = verdict.trials
    reference = compare(outputs(2), outputs(3), FLOAT32)
    assert trial.worst == reference.worst and trial.detail.endswith(reference.detail)


def test_the_verdict_says_what_was_asked():
    assert decide(ladder(GRAPHS), FakeProbe({})).asked == "auto"
    assert decide([GRAPHS], FakeProbe({}), by_hand=True, asked="graphs").asked == "graphs"


def test_what_disagrees_is_named():
    plain = outputs()
    assert compare(_moved(plain), plain, FLOAT32).detail == "no gap"

    def far(x):
        return x + 1.0

    found = compare(_moved(plain, mean=far), plain, BF16)
    assert found.detail == "plan mean of worker 0: 1 apart (allowed 0.05)"
    found = compare(_moved(plain, action=far), plain, FLOAT32)
    assert found.detail == "action of worker 0: 1 apart (allowed 0.001)"
    assert FastPath("graphs").describe() == "compiled with CUDA graphs, float32"
    assert SPLIT.describe() == "one process per worker" and SPLIT.label == SPLIT.describe()


def test_float32_under_tf32_does_not_compare_the_drawn_action():
    # On CUDA float32 matmuls run in TF32 (on both sides): a rounding there reorders near-tied
    # elites, and the plan draws another one; the losses, weights and plan mean still count.
    assert tolerance(EAGER_PACK, tf32=True) is TF32 and tolerance(CPU_PACK, tf32=True) is BF16
    assert tolerance(EAGER_PACK) is FLOAT32 and TF32.mean == 10 * FLOAT32.mean

    class OtherElite(FakeProbe):
        def pair(self, path):
            fast, reference = super().pair(path)
            fast.action = -reference.action
            return fast, reference

    assert decide(ladder(EAGER_PACK), OtherElite({})).path == SPLIT
    assert decide(ladder(EAGER_PACK), OtherElite({}), tf32=True).path == EAGER_PACK
    verdict = decide(ladder(EAGER_PACK), OtherElite({EAGER_PACK: "perturb"}), tf32=True)
    assert verdict.path == SPLIT and "total_loss of worker" in verdict.trials[0].detail
