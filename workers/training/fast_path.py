"""A training process's start-up self-check: before its first agent step it checks the fast path
it would train on against the plain path (agent/check_probe.py), falls back as the check
decides, and records the verdict in each of its workers' metrics: a SelfCheck record, whose one
line the command line prints and the window shows in its Log tab. bf16 turned on later in a
process that started in float32 is checked the same way before it is used (`bf16_check`).

A pack the check finds unsound (its eager version disagrees with lone agents) ends its process
with SPLIT_PACK, and the run starts each of its workers in a process of its own
(workers/run/owner.py); a torchrun rank cannot be split, and stops with the line instead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agent.check_probe import check_fast_path, check_switch
from agent.self_check import Verdict
from workers.rundir.directory import RunDir
from workers.rundir.records import SelfCheck
from workers.training.trainer import Trainer


class PackUnsound(RuntimeError):
    """The self-check found the pack unsound and it cannot be split (a torchrun rank)."""


def self_check(trainer: Trainer, runs: Sequence[RunDir], who: str, can_split: bool) -> Verdict:
    """Check the trainer's agent's fast path (or the one --fast-path asks for), put it on the
    path the check chose and record why in every worker's metrics. PackUnsound when no path
    agrees and the pack cannot be split."""
    verdict = check_fast_path(trainer.agent, trainer.cfg.fast_path, can_split)
    message = _record(trainer, runs, f"{who}: {verdict.line()}", verdict)
    if not verdict.sound and not verdict.by_hand:
        raise PackUnsound(f"{message}; run one worker per process (a torchrun rank each)")
    return verdict


def bf16_check(trainer: Trainer, runs: Sequence[RunDir], who: str) -> Verdict:
    """bf16 turned on in a process that has not checked it (it started in float32): the
    self-check of the path it would now train on, before its next step, recorded like the
    start-up one. The agent stays in float32 when bf16 disagrees (the verdict's path)."""
    agent = trainer.agent
    by_hand = agent.cfg.fast_path != "auto"
    verdict = check_switch(agent, replace(agent.path, bf16=True), by_hand)
    _record(trainer, runs, f"{who}: bf16 turned on; {verdict.line()}", verdict)
    return verdict


def _record(trainer: Trainer, runs: Sequence[RunDir], message: str, verdict: Verdict) -> str:
    """A SelfCheck record of `verdict` in every worker's metrics; returns its line."""
    path = verdict.path
    record = SelfCheck(
        step=trainer.step,
        path="split" if path.split else path.mode,
        pack=path.pack,
        bf16=path.bf16,
        asked=verdict.asked,
        sound=verdict.sound,
        seconds=round(verdict.seconds, 3),
        compile_seconds=round(verdict.compile_seconds, 3),
        trials=tuple(t.describe() for t in verdict.trials),
        message=message,
    )
    for run in runs:
        run.log(record)
    return message
