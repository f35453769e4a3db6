"""The merge rules (agent/pack/merge_rule.py) as a training process's merge rounds apply them,
against plain restatements: the outer step with Nesterov momentum (torch.optim.SGD on the
change of the mean), the pull, a local policy, and the plain mean at the defaults, bit for bit.
The outer step's state is the pool's (workers/merging/outer.py): it survives a new process, and
a rule changed mid-run takes effect at the next merge in every worker of its lane."""

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist
from conftest import tiny_config
from helpers.process_fakes import (
    FakeTrainer,
    hooks_process,
    make_run,
    records,
    run_steps,
    worker_spec,
)

from agent.errors import ConfigError
from agent.knobs import knobs
from agent.pack.merge_rule import MergeRule, collective_refusal, taken
from workers.merging.files import MergeResult
from workers.merging.outer import Part, PoolOuterStep
from workers.merging.pool_rule import PoolRule, RuleHistory
from workers.remote.connected import wanted
from workers.rundir.directory import DirLock, load_state, save_state
from workers.rundir.knob_record import KnobStore, validate_knobs
from workers.rundir.lanes import Lane
from workers.rundir.records import KnobsApplied, Merge
from workers.rundir.settings import RunSettings
from workers.training.merge_rounds import MergeRounds

CFG = tiny_config(mlp_dim=32, enc_dim=16, latent_dim=16, num_samples=16, num_elites=4)


@pytest.fixture(autouse=True)
def close_trainers():
    yield
    FakeTrainer.close_all()


def pack(tmp_path, cfg=CFG, merge_every=10):
    """One process of two workers that merge with each other (a pack: no files to wait for)."""
    make_run(tmp_path, cfg, RunSettings(workers=2, merge_every=merge_every))
    return hooks_process(tmp_path, cfg, (0, 1), (0, 1), merge_every)


def trained(p, seed: int) -> list[dict]:
    """Give both workers new weights, as if each had trained on; returns them."""
    torch.manual_seed(seed)
    for k in (0, 1):
        weights = p.trainer.weights(k)
        p.trainer.set_weights(k, {n: v + 0.1 * torch.randn_like(v) for n, v in weights.items()})
    return [p.trainer.weights(k) for k in (0, 1)]


def mean_of(states: list[dict]) -> dict:
    return {n: (states[0][n] + states[1][n]) / 2 for n in states[0]}


def close(a: dict, b: dict, names=None) -> bool:
    return all(torch.allclose(a[n], b[n], atol=1e-6) for n in names or a)


def test_the_outer_step_with_nesterov_momentum_is_sgd_on_the_change_of_the_mean(tmp_path):
    """Every weight (the target Qs too) is SGD with Nesterov momentum on the mean's change;
    the Q scale, a running statistic, takes the plain mean."""
    cfg = dataclasses.replace(CFG, outer_lr=0.7, outer_momentum=0.9)
    p = pack(tmp_path, cfg)
    anchor, sgd = None, None
    for n, until in enumerate((10, 20, 30, 40)):
        mean = mean_of(trained(p, n))
        run_steps(p, until)
        weights = {k: v for k, v in mean.items() if k != "q_scale"}
        if anchor is None:  # the pool's first merge under the rule: the mean is the anchor
            anchor = {k: torch.nn.Parameter(v.clone()) for k, v in weights.items()}
            sgd = torch.optim.SGD(anchor.values(), lr=0.7, momentum=0.9, nesterov=True)
        else:  # the outer gradient: anchor - mean
            for k, param in anchor.items():
                param.grad = param.detach() - mean[k]
            sgd.step()
        for k in (0, 1):
            taken = p.trainer.weights(k)
            assert close(taken, {n: v.detach() for n, v in anchor.items()}, list(anchor))
            assert torch.allclose(taken["q_scale"], mean["q_scale"])
    assert any(n.startswith("target_qs.") for n in anchor)
    outer = load_state(tmp_path / "merge" / "outer.pt")
    assert (outer["round"], outer["pool"], outer["merge_every"]) == (4, 0, 10)
    merged = load_state(tmp_path / "merge" / "merged.pt")["model"]  # what an added worker takes
    assert close(merged, {n: v.detach() for n, v in anchor.items()}, list(anchor))
    assert len(records(tmp_path, 0, Merge)) == 4


def test_a_pull_moves_every_tensor_part_of_the_way_the_target_qs_and_q_scale_too(tmp_path):
    p = pack(tmp_path, dataclasses.replace(CFG, merge_pull=0.25))
    own = trained(p, 0)
    own[1]["q_scale"] = torch.tensor(5.0)  # a worker's running Q scale of its own
    p.trainer.set_weights(1, own[1])
    mean = mean_of(own)
    run_steps(p, 10)
    for k in (0, 1):
        expected = {n: own[k][n] + 0.25 * (mean[n] - own[k][n]) for n in mean}
        assert close(p.trainer.weights(k), expected)
    assert any(n.startswith("target_qs.") for n in mean)
    moved = 5 + 0.25 * (float(mean["q_scale"]) - 5)
    assert float(p.trainer.weights(1)["q_scale"]) == pytest.approx(moved) != 5


def test_a_local_policy_is_left_untouched_while_every_other_tensor_is_merged(tmp_path):
    p = pack(tmp_path, dataclasses.replace(CFG, merge_policy=False))
    own = trained(p, 1)
    mean = mean_of(own)
    run_steps(p, 10)
    policy = [n for n in mean if n.startswith("pi.")]
    rest = [n for n in mean if n not in policy]
    assert policy and "q_scale" in rest and any(n.startswith("target_qs.") for n in rest)
    for k in (0, 1):
        weights = p.trainer.weights(k)
        assert all(torch.equal(weights[n], own[k][n]) for n in policy)
        assert close(weights, mean, rest)


def test_the_default_rule_is_the_plain_mean_bit_for_bit_and_keeps_no_outer_state(tmp_path):
    p = pack(tmp_path)
    own = trained(p, 2)
    run_steps(p, 10)
    stacked = {n: torch.stack([own[0][n], own[1][n]]).mean(0) for n in own[0]}
    for k in (0, 1):
        weights = p.trainer.weights(k)
        assert all(torch.equal(weights[n], stacked[n]) for n in stacked)
    assert not (tmp_path / "merge" / "outer.pt").exists()


def test_a_rule_changed_mid_run_takes_effect_at_the_next_merge_in_every_worker_of_its_lane(
    tmp_path,
):
    make_run(tmp_path, CFG, RunSettings(workers=4, merge_every=10))
    lanes = [hooks_process(tmp_path, CFG, ws, ws, 10) for ws in ((0, 1), (2, 3))]
    KnobStore(tmp_path).start_race(CFG, ((0, 1), (2, 3)), (Lane(), Lane()))
    for p in lanes:
        run_steps(p, 5)  # the race seen at step 1: merges at 11, 21, ...
    KnobStore(tmp_path).set(CFG, lane=0, merge_pull=0.5)
    before = []
    for p in lanes:
        own = [p.trainer.weights(k) for k in (0, 1)]
        before.append((own, mean_of(own)))
        run_steps(p, 11)
    (own, mean), (other, other_mean) = before
    for k in (0, 1):  # lane 0: half way; lane 1: the mean, as before
        assert close(lanes[0].trainer.weights(k), {n: (own[k][n] + mean[n]) / 2 for n in mean})
        assert close(lanes[1].trainer.weights(k), other_mean)
    applied = records(tmp_path, 1, KnobsApplied)[-1]
    assert (applied.lane, applied.values["merge_pull"]) == (0, 0.5)


def sgd_anchor(means: list[dict], lr: float, momentum: float, rules=None) -> dict:
    """The anchor of SGD with Nesterov momentum on the change of each mean after the first;
    `rules`: each step's own (lr, momentum), where the rule changed between rounds."""
    anchor = {k: torch.nn.Parameter(v.clone()) for k, v in means[0].items()}
    sgd = torch.optim.SGD(anchor.values(), lr=lr, momentum=momentum, nesterov=True)
    for i, mean in enumerate(means[1:]):
        if rules:
            sgd.param_groups[0].update(lr=rules[i][0], momentum=rules[i][1])
        for k, param in anchor.items():
            param.grad = param.detach() - mean[k]
        sgd.step()
    return {k: v.detach() for k, v in anchor.items()}


def outer_round(folder, pool, parts, round_, merge_every=50, lr=0.5, momentum=0.8):
    """One process's call of its pool's outer step: `parts` as (workers, state) of round_."""
    pieces = [Part(tuple(w), state, round_) for w, state in parts]
    mean = pieces[0].state
    return PoolOuterStep(folder, pool)(mean, pieces, round_, merge_every, lr, momentum, ["w"])


def test_the_outer_state_is_the_pools_a_new_process_goes_on_from_it(tmp_path):
    torch.manual_seed(3)
    means = [{"w": torch.randn(4)} for _ in range(4)]
    taken = [outer_round(tmp_path, 2, [((0, 1), means[r])], r + 1).weights for r in range(3)]
    # Another process in round 3 whose workers are counted already takes the pool's.
    again = outer_round(tmp_path, 2, [((0, 1), {"w": torch.randn(4)})], 3).weights
    assert close(again, taken[2])
    # A restarted process (or a resumed run) goes on from the file in round 4.
    fourth = outer_round(tmp_path, 2, [((0, 1), means[3])], 4).weights
    assert close(fourth, sgd_anchor(means, 0.5, 0.8))


@pytest.mark.parametrize(
    "rules",
    [[(0.5, 0.8), (0.9, 0.8), (0.9, 0.8)], [(0.5, 0.8), (0.5, 0.3), (0.5, 0.3)]],
    ids=["outer_lr changed", "outer_momentum changed"],
)
def test_a_rule_change_steps_from_the_anchor_the_workers_took(tmp_path, rules):
    """Rounds 2-4 stepped, each with its own rule: a change of outer_lr or outer_momentum in
    round 3 steps from round 2's anchor as the workers took it (round 2 is made again with
    its own rule, kept in the pool's file, not round 3's), and round 4 goes on from round 3's."""
    torch.manual_seed(12)
    means = [{"w": torch.randn(4)} for _ in range(4)]
    for r, mean in enumerate(means, 1):
        lr, mu = rules[max(r - 2, 0)]
        took = outer_round(tmp_path, 0, [((0,), mean)], r, lr=lr, momentum=mu).weights
        if r > 1:
            assert close(took, sgd_anchor(means[:r], 0.5, 0.8, rules[: r - 1]))


def test_a_late_workers_update_is_in_the_anchor_the_round_steps_from_the_full_mean(tmp_path):
    """Workers 0 and 1 in two processes: in round 2 the first through has only its own weights
    (its partner evaluating); the late one adds its own, and the round's step is made again
    from the state before it with both. The pool goes on from that anchor in round 3."""
    torch.manual_seed(4)
    w0, w1 = [{"w": torch.randn(4)} for _ in range(3)], [{"w": torch.randn(4)} for _ in range(3)]
    full = [{"w": (a["w"] + b["w"]) / 2} for a, b in zip(w0, w1)]
    outer_round(tmp_path, 0, [((0,), w0[0]), ((1,), w1[0])], 1)
    early = outer_round(tmp_path, 0, [((0,), w0[1])], 2).weights  # alone: its own mean
    assert close(early, sgd_anchor([full[0], w0[1]], 0.5, 0.8))
    late = outer_round(tmp_path, 0, [((1,), w1[1]), ((0,), w0[1])], 2).weights
    assert close(late, sgd_anchor(full[:2], 0.5, 0.8))
    assert not close(late, early)
    third = outer_round(tmp_path, 0, [((0,), w0[2]), ((1,), w1[2])], 3).weights
    assert close(third, sgd_anchor(full, 0.5, 0.8))


def test_a_late_worker_through_real_merge_rounds_is_in_the_anchor(tmp_path):
    """Two processes of one worker each: the first waits out a short timeout for the other
    (evaluating, say), steps alone; the second comes to the same round later and takes an
    anchor made from both workers' weights, as the outer step with every worker would."""
    cfg = dataclasses.replace(CFG, outer_lr=0.7, outer_momentum=0.9)
    make_run(tmp_path, cfg, RunSettings(workers=2, merge_every=10))
    a, b = (hooks_process(tmp_path, cfg, (w,), (0, 1), 10, merge_timeout_s=0.2) for w in (0, 1))
    first = mean_of([a.trainer.weights(0), b.trainer.weights(0)])
    run_steps(a, 10), run_steps(b, 10)  # round 1: the pool's anchor is the mean of both
    torch.manual_seed(5)
    own = []
    for p in (a, b):
        weights = p.trainer.weights(0)
        p.trainer.set_weights(0, {n: v + 0.1 * torch.randn_like(v) for n, v in weights.items()})
        own.append(p.trainer.weights(0))
    run_steps(a, 20)  # b is not there: a takes a step of its own weights alone
    run_steps(b, 20)  # b finds a's round-2 file and its own
    names = [n for n in own[0] if n != "q_scale"]
    expected = sgd_anchor([first, mean_of(own)], 0.7, 0.9)
    assert close(b.trainer.weights(0), expected, names)
    assert not close(a.trainer.weights(0), expected, names)
    left = records(tmp_path, 0, Merge)[-1].left_out
    assert 1 in left and "behind" in left[1]
    assert records(tmp_path, 1, Merge)[-1].participants == (0, 1)


def test_rounds_a_step_skipped_follow_on_the_state_and_are_not_a_restart(tmp_path):
    """With more envs than merge_every a process's rounds go 2, 4, 6: each steps from the one
    before (the state is the pool's newest), never again from the mean."""
    torch.manual_seed(6)
    means = [{"w": torch.randn(3)} for _ in range(3)]
    said = [outer_round(tmp_path, 0, [((0,), m)], r) for m, r in zip(means, (2, 4, 6))]
    assert close(said[-1].weights, sgd_anchor(means, 0.5, 0.8))
    assert said[0].note.startswith("the outer step started from the mean")
    assert [s.note for s in said[1:]] == ["", ""]


def test_rounds_16_apart_follow_on_and_nine_plain_rounds_start_again(tmp_path):
    """num_envs 16 at merge_every 1: a process's rounds go 16, 32, 48, ... Each steps from the
    one before (the pool's rule file remembers every round between as the outer step's), never
    from the mean; a state from before more merged rounds than the file remembers (here nine
    of the plain mean) starts again from the mean, and says why."""
    torch.manual_seed(13)
    ledger, outer = PoolRule(tmp_path, 0), MergeRule(outer_lr=0.5, outer_momentum=0.8)
    means, said = [{"w": torch.randn(3)} for _ in range(4)], []
    for mean, r in zip(means, (16, 32, 48, 64)):
        ledger.for_round(r, outer)
        step = PoolOuterStep(tmp_path, 0)
        said.append(step(mean, [Part((0,), mean, r)], r, 1, 0.5, 0.8, ["w"], ledger.history(r)))
    assert close(said[-1].weights, sgd_anchor(means, 0.5, 0.8))
    assert [s.note for s in said[1:]] == ["", "", ""]
    for r in range(65, 74):  # nine rounds of the plain mean, beyond what the file keeps
        ledger.for_round(r, MergeRule())
    ledger.for_round(80, outer)
    mean = {"w": torch.randn(3)}
    again = PoolOuterStep(tmp_path, 0)(
        mean, [Part((0,), mean, 80)], 80, 1, 0.5, 0.8, ["w"], ledger.history(80)
    )
    assert close(again.weights, mean) and "rounds without the outer step" in again.note
    history = RuleHistory({r: True for r in range(70, 80)}, full=True)
    assert "more than 8 merge rounds back" in history.breaks(64)
    assert history.breaks(70) == "" and RuleHistory({}, full=False).breaks(3) == ""


@pytest.mark.parametrize(
    "damage",
    [{"lr": float("nan")}, {"lr": 1e9}, {"outer_momentum": 2.0}, {"anchor": {"w": None}}],
    ids=["lr nan", "lr huge", "momentum above 1", "anchor not a tensor"],
)
def test_an_outer_state_with_values_out_of_range_starts_again_from_the_mean(tmp_path, damage):
    """The round's lr and momentum kept in outer.pt are checked against their knobs' ranges,
    and its tensors for being finite tensors, as rule.json's are: a damaged file's are never
    used to step the anchor."""
    torch.manual_seed(14)
    outer_round(tmp_path, 0, [((0,), {"w": torch.randn(3)})], 1)
    outer_round(tmp_path, 0, [((0,), {"w": torch.randn(3)})], 2)
    payload = load_state(tmp_path / "outer.pt")
    save_state(tmp_path / "outer.pt", {**payload, **damage})
    mean = {"w": torch.randn(3)}
    said = outer_round(tmp_path, 0, [((0,), mean)], 3)
    assert close(said.weights, mean) and "the outer step started from the mean" in said.note
    assert "unreadable" in said.note or "not finite tensors" in said.note


@pytest.mark.parametrize(
    "pool, merge_every, why",
    [(3, 50, "a new merge pool"), (2, 100, "the merge frequency changed")],
    ids=["another pool", "another frequency"],
)
def test_the_outer_step_starts_again_from_the_mean_and_says_why(tmp_path, pool, merge_every, why):
    outer_round(tmp_path, 2, [((0,), {"w": torch.zeros(3)})], 1)
    mean = {"w": torch.ones(3)}
    said = outer_round(tmp_path, pool, [((0,), mean)], 2, merge_every)
    assert torch.equal(said.weights["w"], mean["w"]) and why in said.note


def test_a_process_a_round_behind_takes_the_pools_anchor_and_says_so(tmp_path):
    torch.manual_seed(7)
    means = [{"w": torch.randn(3)} for _ in range(2)]
    for r, mean in enumerate(means, 1):
        outer_round(tmp_path, 0, [((0,), mean)], r)
    late = outer_round(tmp_path, 0, [((1,), {"w": torch.randn(3)})], 1)
    assert close(late.weights, sgd_anchor(means, 0.5, 0.8))
    assert "a round behind the pool's outer step (round 2)" in late.note


def test_a_locked_outer_state_leaves_the_round_to_the_mean_without_a_crash(tmp_path):
    mean = {"w": torch.ones(2)}
    held = DirLock(str(tmp_path / "outer.pt") + ".lock", timeout=1)
    with held:  # another process stuck inside the lock
        step = PoolOuterStep(tmp_path, 0, timeout_s=0.1)
        said = step(mean, [Part((0,), mean, 1)], 1, 10, 0.7, 0.9, ["w"])
    assert torch.equal(said.weights["w"], mean["w"]) and "stayed locked for 0.1 s" in said.note


def test_a_damaged_outer_state_starts_again_from_the_mean(tmp_path):
    save_state(tmp_path / "outer.pt", {"pool": 0, "round": 1})  # no anchor
    mean = {"w": torch.ones(2)}
    said = outer_round(tmp_path, 0, [((0,), mean)], 2, 10)
    assert torch.equal(said.weights["w"], mean["w"]) and "unreadable" in said.note
    (tmp_path / "outer.pt").write_bytes(b"torn")
    said = outer_round(tmp_path, 0, [((0,), mean)], 3, 10)
    assert torch.equal(said.weights["w"], mean["w"]) and "unreadable" in said.note


def test_the_merge_rule_knobs_refuse_what_they_cannot_do():
    assert collective_refusal({"outer_lr": 0.7}) and collective_refusal({"outer_momentum": 0.9})
    assert collective_refusal({"merge_pull": 0.1, "merge_policy": False}) is None
    values = {**{k: getattr(CFG, k) for k in knobs("agent")}, "merge_every": 10, "bf16": True}
    assert validate_knobs(CFG, values)["bf16"] is True
    with pytest.raises(Exception, match="bf16 is a CPU knob"):
        validate_knobs(dataclasses.replace(CFG, device="cuda"), values)
    # A connected window never fetches a pool's outer state (twice a model, for workers only).
    assert not wanted("merge/lane-0/outer.pt", -1, True) and wanted("merge/merged.pt", -1, True)


RULES = [
    (pull, lr, mu, policy)
    for pull in (0.001, 0.5, 1.0)
    for lr in (0.01, 1.0, 2.0)
    for mu in (0.0, 0.9, 0.99)
    for policy in (True, False)
]


@pytest.mark.parametrize("pull, lr, mu, policy", RULES)
def test_the_q_scale_stays_a_spread_of_at_least_1_under_every_rule(tmp_path, pull, lr, mu, policy):
    """Every combination of the rule's knobs at their ranges' ends and middles, over rounds in
    which the workers' Q scales fall (an outer step of lr 2 or with momentum would carry the
    scale below 1, or negative): each worker's scale after a merge lies between its own and
    the others' (at least 1, as the scale's own clamp keeps it). A pull with the outer step is
    refused instead."""
    cfg = dataclasses.replace(CFG, merge_policy=policy)
    if pull != 1.0 and (lr != 1.0 or mu != 0.0):
        with pytest.raises(ConfigError, match="does not go with the outer step"):
            dataclasses.replace(cfg, merge_pull=pull, outer_lr=lr, outer_momentum=mu)
        return
    cfg = dataclasses.replace(cfg, merge_pull=pull, outer_lr=lr, outer_momentum=mu)
    folder = tmp_path / "pool"
    folder.mkdir()
    rule = MergeRule.of(cfg)
    step = PoolOuterStep(folder, pool=0)
    torch.manual_seed(8)
    own = [{"w": torch.randn(3), "q_scale": torch.tensor(s)} for s in (40.0, 30.0)]
    for round_ in range(1, 6):
        for k, state in enumerate(own):  # each trains on: its scale falls toward 1
            scale = 1 + (state["q_scale"] - 1) * 0.3 * (k + 1)
            own[k] = {"w": state["w"] + torch.randn(3), "q_scale": scale}
        mean = {n: (own[0][n] + own[1][n]) / 2 for n in own[0]}
        target = mean
        if rule.outer:
            parts = [Part((k,), state, round_) for k, state in enumerate(own)]
            target = step(mean, parts, round_, 10, lr, mu, rule.stepped(mean)).weights
        for k in range(2):
            after = taken(own[k], target, rule)["q_scale"]
            low, high = sorted(float(s["q_scale"]) for s in own)
            assert 1.0 <= low - 1e-6 <= float(after) <= high + 1e-6, (round_, k)
        own = [taken(state, target, rule) for state in own]


def test_an_outer_step_that_would_carry_the_q_scale_negative_leaves_it_the_mean(tmp_path):
    """Through a process's real merge rounds, lr 2 and momentum 0.99 (the ranges' ends): the
    Q scale falling from 30 to 5 would be stepped to 2m - a = -20; it is the mean, 5."""
    cfg = dataclasses.replace(CFG, outer_lr=2.0, outer_momentum=0.99)
    p = pack(tmp_path, cfg)
    for until, scale in ((10, 30.0), (20, 5.0)):
        for k in (0, 1):
            weights = p.trainer.weights(k)
            p.trainer.set_weights(k, {**weights, "q_scale": torch.tensor(scale)})
        run_steps(p, until)
        assert [float(p.trainer.weights(k)["q_scale"]) for k in (0, 1)] == [scale, scale]


def test_with_the_policy_kept_every_consumer_takes_a_workers_own_weights(tmp_path):
    """merge_policy off, two workers whose policies never shared weights, one of them
    non-finite at the second merge: merged.pt (the showcase's, an added worker's, a race's
    start) is worker 0's weights as it holds them after the merge, its own policy with the
    merged world model, not an average of two policies; the reset worker takes the same; the
    outer step's state holds no policy tensor."""
    cfg = dataclasses.replace(CFG, merge_policy=False, outer_lr=0.7)
    p = pack(tmp_path, cfg)
    trained(p, 9)
    run_steps(p, 10)
    merged = load_state(tmp_path / "merge" / "merged.pt")["model"]
    assert close(merged, p.trainer.weights(0))
    assert not close(merged, p.trainer.weights(1), [n for n in merged if n.startswith("pi.")])
    outer = load_state(tmp_path / "merge" / "outer.pt")
    assert outer["total"] and not [n for n in outer["total"] if n.startswith("pi.")]
    trained(p, 10)
    with torch.no_grad():  # straight into the pack: checked_model_state refuses a NaN
        p.trainer.agent.model.state_dict()["pi.layers.0.weight"][1, 0, 0] = float("nan")
    run_steps(p, 20)
    merged = load_state(tmp_path / "merge" / "merged.pt")["model"]
    assert close(merged, p.trainer.weights(0)) and close(merged, p.trainer.weights(1))
    (merge,) = records(tmp_path, 0, Merge)[-1:]
    assert merge.left_out == {1: "non-finite weights"}


@pytest.mark.parametrize("pull", [1.0, 0.5])
def test_a_torchrun_rank_reset_with_the_policy_kept_takes_a_real_workers_weights(
    tmp_path, monkeypatch, pull
):
    """A torchrun job with merge_policy off: rank 0's only worker is not finite, workers 1
    and 2 are on other ranks (a fake collective, which sends worker 1's own weights when
    asked, as the real one does for the lowest participant). The reset worker, and merged.pt
    that rank 0 publishes, take what worker 1 holds after the merge (its own policy with the
    world model it trained it with), not the mean's average of two unshared policies."""
    cfg = dataclasses.replace(CFG, merge_policy=False, merge_pull=pull)
    make_run(tmp_path, cfg, RunSettings(workers=3))
    trainer = FakeTrainer(cfg, tmp_path, [0])
    spec = worker_spec(tmp_path, cfg, 0, (0, 1, 2))
    rounds = MergeRounds([spec], trainer, lambda **_: None, lambda: False)
    w = trainer.weights(0)
    others = [{k: v + 1.0 for k, v in w.items()}, {k: v - 3.0 for k, v in w.items()}]
    mean = mean_of(others)

    class Collective:
        def merge(self, round_, state, members, step, own=None, wants=False):
            result = MergeResult(dict(mean), round_, [1, 2], {0: "non-finite weights"}, {}, step)
            if wants:  # the lowest participant's own weights, as the real collective sends
                result.source = dict(others[0])
            return result

    rounds.collective = Collective()
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    with torch.no_grad():
        trainer.agent.model.state_dict()["pi.layers.0.weight"][0, 0, 0] = float("nan")
    rounds.merge(1)
    expected = taken(others[0], mean, MergeRule.of(cfg))
    policy = [n for n in w if n.startswith("pi.")]
    assert close(trainer.weights(0), expected) and close(expected, others[0], policy)
    assert close(load_state(tmp_path / "merge" / "merged.pt")["model"], expected)


def test_a_rule_change_takes_effect_at_one_round_in_every_process_of_a_pool(tmp_path):
    """Two processes of one pool: a pull of 0.5 is set after process a merged round 2 and
    before process b did. b applies it first, and still merges round 2 as the pool does, all
    the way to the mean (the rule of a round is its first process's: merge/rule.json); from
    round 3, whose first process has the pull, both pull."""
    make_run(tmp_path, CFG, RunSettings(workers=2, merge_every=10))
    a, b = (hooks_process(tmp_path, CFG, (w,), (0, 1), 10, merge_timeout_s=0.2) for w in (0, 1))
    run_steps(a, 19), run_steps(b, 19)
    run_steps(a, 20)  # alone, after the timeout: round 2's rule is the plain mean
    KnobStore(tmp_path).set(CFG, merge_pull=0.5)
    a_file = load_state(tmp_path / "merge" / "worker-0.pt")["model"]
    own = b.trainer.weights(0)
    run_steps(b, 20)
    assert records(tmp_path, 1, KnobsApplied)[-1].values["merge_pull"] == 0.5
    assert close(b.trainer.weights(0), mean_of([a_file, own]))
    assert "the pool's rule for round 2" in records(tmp_path, 1, Merge)[-1].note
    run_steps(a, 30)  # a applies the pull at step 21: round 3 is the pull's
    own = b.trainer.weights(0)
    a_file = load_state(tmp_path / "merge" / "worker-0.pt")["model"]
    run_steps(b, 30)
    mean = mean_of([a_file, own])
    assert close(b.trainer.weights(0), {n: (own[n] + mean[n]) / 2 for n in mean})
    rules = json.loads((tmp_path / "merge" / "rule.json").read_text())["rounds"]
    assert (rules["2"]["pull"], rules["3"]["pull"]) == (1.0, 0.5)


def test_the_outer_step_turned_off_and_on_again_starts_from_the_mean_and_says_why(tmp_path):
    """Rounds 1-2 under the outer step, round 3 the plain mean, round 4 the outer step again:
    round 4 does not step from round 2's stale anchor but takes the mean, and its merge
    record says why."""
    cfg = dataclasses.replace(CFG, outer_lr=0.5)
    p = pack(tmp_path, cfg)
    run_steps(p, 20)
    KnobStore(tmp_path).set(cfg, outer_lr=1.0)
    run_steps(p, 30)
    KnobStore(tmp_path).set(cfg, outer_lr=0.5)
    mean = mean_of(trained(p, 11))
    run_steps(p, 40)
    names = [n for n in mean if n != "q_scale"]
    assert close(p.trainer.weights(0), mean, names)
    note = records(tmp_path, 0, Merge)[-1].note
    assert note.startswith("the outer step started from the mean: rounds without the outer step")
