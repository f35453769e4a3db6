"""Benchmarks of the multi-worker machinery: merge cost, merging gain, Adam moments at a merge,
knob lag, player cost."""

from __future__ import annotations

import copy
import dataclasses
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.config import Config
from agent.envs import env_of
from agent.errors import UserError
from agent.pack.merge_rule import MergeRule
from workers.door import Eval, KnobsApplied, Run, RunSettings

# The merge and Adam-moment benchmarks time the machinery itself, inside workers/.
from workers.merging.files import FileMergeBackend, average_states, distance
from workers.merging.outer import PoolOuterStep
from workers.training.stop_training import StopTraining
from workers.training.trainer import NoHooks, Trainer


def agent_for(cfg: Config) -> TDMPC2:
    """A fresh agent of `cfg` for its task's observation and action sizes."""
    env = env_of(cfg, cfg.seed)
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    return TDMPC2(cfg, obs_dim, action_dim)


# The merge rules timed side by side (agent/pack/merge_rule.py). The outer step's state file is
# written every merge; the pull and a local policy change only how the merged weights are loaded.
MERGE_RULES = {
    "mean": MergeRule(),
    "outer 0.7, 0.9": MergeRule(outer_lr=0.7, outer_momentum=0.9),
    "pull 0.1": MergeRule(pull=0.1),
    "local policy": MergeRule(policy=False),
}


def merge_benchmark(cfg: Config, workers: int, repeats: int) -> dict:
    """What one merge costs a worker under each merge rule: publish own weights, read the
    others', average, (the outer step), write the merged file, load it as the rule says. The
    other workers' files are already there (they are not waited for). The rules take turns
    within each repeat, so that they share the machine's state."""
    agent = agent_for(cfg)
    state = {k: v.detach().cpu().clone() for k, v in agent.model_state().items()}
    params = sum(v.numel() for v in state.values())
    times: dict[str, list[float]] = {name: [] for name in MERGE_RULES}
    with tempfile.TemporaryDirectory() as tmp:
        backend = FileMergeBackend(tmp, list(range(workers)), timeout_s=5)
        outer = PoolOuterStep(backend.dir, pool=0)
        round_ = 0
        for _ in range(repeats):
            for name, rule in MERGE_RULES.items():
                round_ += 1
                for other in range(1, workers):
                    backend.publish(other, round_, state)
                # The outer step's rounds follow on each other (from the second, a full step).
                step = partial(
                    outer,
                    round_=round_,
                    merge_every=1,
                    lr=rule.outer_lr,
                    momentum=rule.outer_momentum,
                    names=rule.stepped(state),
                )
                step = (lambda mean, parts, s=step: s(mean, parts).weights) if rule.outer else None
                start = time.perf_counter()
                result = backend.merge(0, round_, state, rule=step)
                agent.assign(result.merged, [0], (), rule.pull, rule.kept(list(result.merged)))
                if agent.device.type == "cuda":
                    torch.cuda.synchronize(agent.device)
                times[name].append((time.perf_counter() - start) * 1000)
                agent.load_model_state(state, [0])  # the next rule starts from the same weights
    medians = {name: round(statistics.median(t), 1) for name, t in times.items()}
    return {
        "model_size": cfg.model_size,
        "workers": workers,
        "floats_merged": params,
        "merge_ms": medians["mean"],
        "rules_ms": medians,
    }


def merge_gain_benchmark(
    cfg: Config, worker_counts: list[int], threshold: float, merge_every: int, run_root: str
) -> dict:
    """Agent steps per worker until the workers' mean evaluation return reaches `threshold`,
    for each worker count, all with the same config. The point of the program."""
    results = {}
    for count in worker_counts:
        settings = RunSettings(workers=count, merge_every=merge_every, checkpoint_every=10**9)
        run = Run.create(Path(run_root) / f"workers-{count}", cfg, settings)
        start = time.monotonic()
        run.start()
        run.workers.wait()
        evals: dict[int, list[float]] = {}
        for record in run.new_events():
            if isinstance(record, Eval):
                evals.setdefault(record.step, []).append(record.ret)
        curve = sorted((step, float(np.mean(r))) for step, r in evals.items() if len(r) == count)
        reached = next((step for step, ret in curve if ret >= threshold), None)
        results[count] = {
            "steps_to_threshold": reached,
            "curve": curve,
            "wall_s": round(time.monotonic() - start, 1),
        }
    base = results[worker_counts[0]]["steps_to_threshold"]
    for r in results.values():
        reached = r["steps_to_threshold"]
        r["speedup_vs_first"] = round(base / reached, 2) if base and reached else None
    return {"task": cfg.task, "threshold": threshold, "merge_every": merge_every, "runs": results}


def live_benchmark(cfg: Config, workers: int, seconds: float, run_dir: str) -> dict:
    """A live multi-worker run: knob-change latency in agent steps, and the showcase player's
    cost on the workers' steps/s (phases without and with the player, same run)."""
    run = Run.create(run_dir, cfg, RunSettings(workers=workers, merge_every=10**6))
    run.start()

    def steps() -> list[float]:
        return [w["step"] for w in run.workers.progress()]

    def training() -> bool:
        return all(w["state"] == "training" for w in run.workers.progress())

    while not training():
        time.sleep(0.5)

    def rate(duration: float) -> float:
        first, start = steps(), time.monotonic()
        time.sleep(duration)
        return sum(b - a for a, b in zip(first, steps())) / (time.monotonic() - start) / workers

    knob_sets = []
    for i in range(3):
        time.sleep(seconds / 6)
        at = steps()
        version = run.knobs.set(horizon=4 if i % 2 == 0 else 3)
        knob_sets.append((version, at))
    time.sleep(5)
    applied = {
        (r.worker, r.version): r.step for r in run.new_events() if isinstance(r, KnobsApplied)
    }
    lags = [
        applied[(w, v)] - at[w] for v, at in knob_sets for w in range(workers) if (w, v) in applied
    ]
    without = rate(seconds)
    run.showcase.start(240, 320, realtime=True)
    while run.showcase.read_frame() is None:
        time.sleep(0.5)
    first_frame, start = run.showcase.read_frame(), time.monotonic()
    with_player = rate(seconds)
    last_frame = run.showcase.read_frame() or first_frame
    frames = (last_frame[1]["sequence"] - first_frame[1]["sequence"]) / 2
    run.stop()
    return {
        "workers": workers,
        "knob_changes": len(knob_sets),
        "knob_applied_by": len(lags),
        "knob_lag_agent_steps_max": max(lags) if lags else None,
        "steps_per_s_per_worker_without_player": round(without, 2),
        "steps_per_s_per_worker_with_player": round(with_player, 2),
        "player_cost": round(1 - with_player / without, 3) if without else None,
        "player_frames_per_s": round(frames / (time.monotonic() - start), 2),
    }


def _trained_agent_state(cfg: Config, steps: int) -> tuple[dict, Trainer]:
    """Train one agent in this process for `steps` agent steps; its state and trainer."""
    trainer = Trainer(cfg, progress=False)

    class StopAt(NoHooks):
        def after_step(self, t: Trainer) -> None:
            if t.step >= steps:
                raise StopTraining

    trainer.run(StopAt())
    return copy.deepcopy(trainer.agent.state_dict()), trainer


def _optimiser_moments(states: list[dict], key: str) -> dict:
    """One optimiser's state dict with Adam's moments averaged over the workers' copies."""
    out = copy.deepcopy(states[0][key])
    for index, entry in out["state"].items():
        for moment in ("exp_avg", "exp_avg_sq"):
            entry[moment] = torch.stack([s[key]["state"][index][moment] for s in states]).mean(0)
    return out


def merge_optimiser_benchmark(cfg: Config, train_steps: int, updates: int) -> dict:
    """What to do with Adam's moments at a merge, measured: two workers train apart for
    `train_steps`, their weights are averaged, and worker 0 goes on for `updates` updates
    (the same batches and RNG for every choice) keeping its own moments, with the workers'
    moments averaged, or with the moments reset; and, for reference, without the merge."""
    if train_steps <= cfg.resolved_seed_steps:
        raise UserError(
            f"the workers must train past the seed steps ({cfg.resolved_seed_steps}) before "
            f"a merge means anything; got {train_steps} steps"
        )
    seeds = (cfg.seed, cfg.seed + 1000)  # as the run seeds workers 0 and 1
    states, trainers = zip(
        *(_trained_agent_state(dataclasses.replace(cfg, seed=s), train_steps) for s in seeds)
    )
    merged = average_states([s["model"] for s in states])
    buffer = trainers[0].buffer
    batches = [buffer.sample() for _ in range(updates)]
    obs_dim, action_dim = trainers[0].agent.obs_dim, trainers[0].agent.action_dim
    averaged = {
        "optim": _optimiser_moments(states, "optim"),
        "pi_optim": _optimiser_moments(states, "pi_optim"),
    }
    choices = {  # name: (agent state, whether Adam starts afresh)
        "no merge (reference)": (states[0], False),
        "own moments (used)": ({**states[0], "model": merged}, False),
        "averaged moments": ({**states[0], "model": merged, **averaged}, False),
        "reset moments": ({**states[0], "model": merged}, True),
    }
    results = {}
    for name, (state, reset) in choices.items():
        agent = TDMPC2(cfg, obs_dim, action_dim)
        agent.load_state_dict(copy.deepcopy(state), weights_only=reset)
        start = {k: v.clone() for k, v in agent.model_state().items()}
        torch.manual_seed(cfg.seed)
        losses, moved_10 = [], None
        for i, batch in enumerate(batches):
            losses.append(float(agent.update(batch)["total_loss"]))
            if i == 9:
                moved_10 = distance(agent.model_state(), start)
        results[name] = {
            "loss_first_10": round(float(np.mean(losses[:10])), 4),
            f"loss_first_{updates}": round(float(np.mean(losses)), 4),
            "weights_moved_in_10_updates": round(moved_10, 4) if moved_10 is not None else None,
        }
    return {
        "task": cfg.task,
        "model_size": cfg.model_size,
        "train_steps_apart": train_steps,
        "updates_after_merge": updates,
        "distance_between_workers": round(distance(states[0]["model"], states[1]["model"]), 4),
        "choices": results,
    }
