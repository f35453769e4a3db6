"""The merge rounds of one training process: a pack first averages its own merging workers on
the device; with workers in other processes that mean goes through the file backend
(workers/merging/files.py), and every worker takes the merged weights. Kept apart from the hooks
(hooks.py), which start a round every `merge_every` agent steps, because a round is its
own protocol: who takes part, who is left out, what is recorded.
Over 300 lines because a round, the pools it follows (a race, a promotion, a late entry) and
the promotion's last round share one process's pool state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from agent.errors import WeightsError
from agent.pack.merge_rule import MergeRule, State, taken
from workers.merging.collective import DistributedMergeBackend
from workers.merging.files import FileMergeBackend, MergeCancelled, pool_base, pool_weights
from workers.merging.outer import OuterRound, Part, PoolOuterStep
from workers.merging.pool_rule import PoolRule
from workers.rundir.directory import load_state, save_state
from workers.rundir.paths import promoted_path
from workers.rundir.records import KnobRecord, Merge, MergeSkipped, MergeStopped, Record
from workers.training.first_weights import StartState
from workers.training.spec import STATES, WorkerSpec
from workers.training.stop_training import StopTraining
from workers.training.trainer import Trainer

PROMOTION_ROUND = 10**9  # a promoted lane's last round, past any round it merged in the race


class MergeRounds:
    """The merges of the workers of one process (one, or a pack) that take part in merging."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        trainer: Trainer,
        set_snapshot: Callable[..., None],
        stopping: Callable[[], bool],
        start: StartState | None = None,
    ):
        """`set_snapshot`: writes snapshot fields of every worker; `stopping`: whether a stop
        was asked (a merge waiting on the others ends then); `start`: the pool these workers'
        checkpoint was in, and whether they joined it with its merged weights."""
        spec = specs[0]  # run-wide fields are the same in every worker's spec
        self.specs, self.trainer, self.set = specs, trainer, set_snapshot
        # Positions (in the pack) of the workers that merge: the control worker does not.
        self.merging = [k for k, sp in enumerate(specs) if sp.merge_with]
        merge_with = next(sp.merge_with for sp in specs if sp.merge_with)
        self.stopping = stopping
        self.backend = FileMergeBackend(
            spec.run_path, list(merge_with), spec.merge_timeout_s, stop=stopping
        )
        # The trainer's update count when these workers joined a pool with its weights (added,
        # restarted): until they update, their weights are the pool's and stay out of the mean.
        start = start or StartState()
        self.joined_updates: int | None = trainer.updates if start.joined else None
        # The merge pool (the knob version that formed it, the lane) and the agent step at
        # which these workers entered it: merge rounds are counted from there.
        self.pool, self.lane, self.pool_base = start.pool, start.lane, start.pool_base
        self.backend.base = self.pool_base
        # Whether the lane these workers are in never merges (merge=off): each round they only
        # publish their own weights (the showcase's, a promotion's), and average nothing.
        self.solo = False
        # A rank of a torchrun job merges with the other ranks in a collective; the file
        # backend then only publishes the merged weights (rank 0: for the showcase).
        self.collective = (
            DistributedMergeBackend(list(merge_with), max(merge_with) + 1, trainer.agent.device)
            if spec.distributed
            else None
        )
        self.merges = 0

    def follow(self, record: KnobRecord) -> bool:
        """Follow the knob record's layout; True when these workers entered a new pool (a race's
        start, a promotion) at this step. A race's lanes all start from the weights the run
        merged last; after a promotion with weights every worker takes the winner's; a pool
        that has merged since takes its newest merged weights. (A torchrun job does not race:
        its ranks keep their one pool.)"""
        spec = self.specs[0]
        if spec.distributed:
            return False
        lane = record.lane_of(spec.index)
        self.solo = not record.merges(lane)
        # A lane's workers are the record's; the run's pool follows merge/members.json.
        workers = record.lanes[lane] if lane is not None else spec.merge_with
        if (record.pool, lane) == (self.pool, self.lane):
            if lane is not None:  # workers added to the lane, or taken out
                self.backend.lane_workers = set(workers)
            return False
        newest = None
        if record.pool > self.pool:
            # A pool that has merged since it formed has weights newer than those it began
            # with: a worker coming to it late (added, restarted, resumed) takes them.
            newest = record.merges(lane) and pool_weights(spec.run_path, lane, record.pool)
            if newest:
                self._take(newest)
            # Files of the pool being left only: an older race's stay in the same folders.
            elif record.lanes:
                self._take(pool_weights(spec.run_path, self.lane, self.pool))
            elif record.promoted_lane is not None:
                self._take(self._promoted(record))
        base = pool_base(spec.run_path, lane, record.pool) if newest else None
        # Rounds count from this step, or in a pool that has merged, as its slowest worker's
        # do (this one starts at that worker's step): the same rounds, at the same time.
        self.pool, self.lane = record.pool, lane
        self.pool_base = self.trainer.step if base is None else base
        self.backend = FileMergeBackend(
            spec.run_path, list(workers), spec.merge_timeout_s, self.stopping, lane, record.pool
        )
        self.backend.base = self.pool_base
        return True

    def _promoted(self, record: KnobRecord) -> Path | None:
        """The promoted lane's weights as they were at the promotion: its workers make them
        as they follow it (a last merge round of their pool, or the lane's one worker's own
        in a lane that never merged); every other worker waits for the file, up to the merge
        timeout, and then takes the lane's newest merged weights. A worker that comes to the
        promotion later (restarted, added) finds the file written."""
        spec = self.specs[0]
        path = promoted_path(spec.run_path, record.pool)
        if not path.exists() and (self.lane, self.pool) == (
            record.promoted_lane,
            record.promoted_pool,
        ):
            self._publish_promoted(record, path)
        deadline = time.monotonic() + spec.merge_timeout_s
        while not path.exists() and time.monotonic() < deadline and not self.stopping():
            time.sleep(0.05)
        if path.exists():
            return path
        old = record.promoted_lane, record.promoted_pool or 0, record.promoted_worker
        return pool_weights(spec.run_path, *old)

    def _publish_promoted(self, record: KnobRecord, path: Path) -> None:
        """This process's part of the promoted lane's weights: a merge round of the lane's
        workers now (the pool they leave), or the promoted worker's own weights. The lane's
        merged.pt ends as what the promotion hands on (with the policy kept too: a worker's
        own, never the averaged policies), so a worker that finds no promotion file in time
        takes the same weights."""
        t, agent = self.trainer, self.trainer.agent
        own = {self.specs[k].index: k for k in self.merging}
        if record.promoted_worker is not None:
            if record.promoted_worker not in own:
                return
            state = agent.model_state(own[record.promoted_worker])
        else:
            pack = agent.pack_mean(self.merging)
            if pack is None:  # non-finite: filed as such, so that the lane's others go on
                state = {k: v.detach().cpu() for k, v in agent.model_state(self.merging[0]).items()}
                publish = self.backend.publish
                self._guarded(
                    lambda: publish(min(own), PROMOTION_ROUND, state, t.step, covers=tuple(own))
                )
                return
            state, good, _ = pack
            state = {k: v.detach().cpu() for k, v in state.items()}
            members, step = tuple(self.specs[k].index for k in good), t.step
            if [w for w in self.backend.members() if w not in own]:
                try:
                    result = self._guarded(
                        lambda: self.backend.merge(
                            min(own),
                            PROMOTION_ROUND,
                            state,
                            t.step,
                            members,
                            tuple(own),
                            publish=False,  # below, as the promotion hands it on
                        )
                    )
                except MergeCancelled:
                    return  # a stop while waiting: the checkpoint comes first, not the file
                if result is None or min(result.participants) not in own:
                    return  # the process of the lane's lowest participant writes the file
                state, members, step = result.merged, tuple(result.participants), result.step
            rule = MergeRule.of(agent.cfg)
            if not rule.policy:
                # With the policy kept, the lane's weights are its lowest participant's as it
                # would hold them after this round: its own policy, never an average.
                state = taken(agent.model_state(own[min(members)]), state, rule)
        final = {k: v.detach().cpu() for k, v in state.items()}
        payload = {"model": final, "step": t.step, "pool": record.pool}
        try:
            self._guarded(lambda: save_state(path, payload, exclusive=True))
        except FileExistsError:
            return  # another process of the lane wrote it first (each timed out on the other)
        if record.promoted_worker is None:  # the lane's merged.pt ends as the same
            lane = list(members)
            self._guarded(lambda: self.backend.publish_merged(PROMOTION_ROUND, final, lane, step))

    def _take(self, path: Path | None) -> None:
        """Weights for every worker of this process that merges: the merged ones of the pool
        they leave, or a promoted lane's (None: there are none)."""
        if path is None:
            return
        agent = self.trainer.agent
        weights = agent.checked_model_state(load_state(path, agent.device)["model"])
        pack = agent.pack_mean(self.merging)
        bad = self.merging if pack is None else list(pack[2])
        agent.assign(weights, self.merging, bad)  # a non-finite worker's Adam anew too
        if pack is None:  # as after a round sat out: out of the mean until it updates
            self.joined_updates = self.trainer.updates

    def pool_state(self) -> dict:
        """What a checkpoint keeps of the pool (StartState reads it back)."""
        return {"pool": self.pool, "lane": self.lane, "pool_base": self.pool_base}

    def joining(self) -> str | None:
        """Why these workers stay out of the mean this round, if they do."""
        if self.joined_updates is None:
            return None
        if self.trainer.updates > self.joined_updates:
            self.joined_updates = None
            return None
        return "joined the pool and has made no update of its own yet"

    def merge(self, round_: int, merge_every: int = 0) -> None:
        """A merge round: a pack averages its merging workers on the device; with workers in
        other processes that mean (weighing as many workers as it holds) goes through the
        file backend. A worker with non-finite weights is left out and reset from the mean.
        The merge rule (agent/pack/merge_rule.py) says what the workers take from the mean:
        the pool's for this round (workers/merging/pool_rule.py), whose outer step state is
        the pool's too (`merge_every`: rounds follow on it only at one frequency)."""
        t, agent = self.trainer, self.trainer.agent
        own = [self.specs[k].index for k in self.merging]
        if self.solo:
            for k, index in zip(self.merging, own):
                state = {n: v.detach().cpu() for n, v in agent.model_state(k).items()}
                self._guarded(lambda i=index, s=state: self.backend.publish(i, round_, s, t.step))
            return
        index_of = dict(zip(self.merging, own))
        others = [w for w in self.backend.members() if w not in own]
        self.set(state=STATES.index("merging"))
        start = time.perf_counter()
        pack = agent.pack_mean(self.merging)
        if pack is None and self.collective is None:
            return self._sit_out(round_, own, others, start)
        files = self.collective is None and bool(others or self.backend.down)
        rule, notes = MergeRule.of(agent.cfg), []
        ledger = PoolRule(self.backend.dir, self.pool)
        if self.collective is None:  # the processes of one pool merge a round under one rule
            rule, said = self._guarded(lambda: ledger.for_round(round_, rule))
            notes += [said] if said else []
        outer = None
        if rule.outer and self.collective is None:  # a torchrun job refuses the knobs
            step = PoolOuterStep(self.backend.dir, self.pool)

            def outer(mean: State, parts: list[Part]) -> State:
                names = rule.stepped(mean)
                lr, mu, past = rule.outer_lr, rule.outer_momentum, ledger.history(round_)
                done: OuterRound = self._guarded(
                    lambda: step(mean, parts, round_, merge_every, lr, mu, names, past)
                )
                notes.extend([done.note] if done.note else [])
                return done.weights

        if pack is None:  # every rank takes part in the collective: this one with nothing
            shapes = agent.model_state(self.merging[0])
            mean = {k: v for k, v in shapes.items() if v.is_floating_point()}
            good, bad = [], {k: "non-finite weights" for k in self.merging}
        else:
            mean, good, bad = pack
        participants = [index_of[k] for k in good]
        left_out = {index_of[k]: why for k, why in bad.items()}
        step_of, source = t.step, None
        if self.collective is not None:
            slot = {index: k for k, index in index_of.items()}
            result = self.collective.merge(
                round_,
                mean,
                tuple(participants),
                t.step,
                own=lambda index: agent.model_state(slot[index]),
                wants=not rule.policy and not good,
            )
            merged, participants, source = result.merged, result.participants, result.source
            left_out.update(result.left_out)
            others_distances = {w: d for w, d in result.distances.items() if w not in own}
            step_of = result.step
        elif files:
            state = {k: v.detach().cpu() for k, v in mean.items()}
            try:
                result = self._guarded(
                    lambda: self.backend.merge(
                        own[0],
                        round_,
                        state,
                        t.step,
                        tuple(participants),
                        tuple(own),
                        joining=self.joining(),
                        rule=outer,
                        publish=False,
                    )
                )
            except MergeCancelled:
                # Not waiting out the others: checkpoint (own weights, unmerged) and exit now.
                self._log_merging(MergeStopped(step=t.step, round=round_))
                raise StopTraining from None
            merged, participants = result.merged, result.participants
            left_out.update(result.left_out)
            others_distances = {w: d for w, d in result.distances.items() if w not in own}
            step_of = result.step
        else:
            others_distances = {}
            # Every merging worker is here: no files to wait for.
            part = Part(tuple(participants), mean, round_)
            merged = mean if outer is None else outer(mean, [part])
        kept = rule.kept(list(merged))
        own_distances = agent.assign(merged, self.merging, list(bad), rule.pull, kept)
        published = self._published(merged, rule, good, list(bad), source)
        if self.collective is not None:
            publishes = dist.get_rank() == 0
        else:  # a kept policy is the pool's lowest participant's, not each process's in turn
            publishes = rule.policy or not participants or min(participants) in own
        if publishes:
            # The merged weights are published for the showcase and for a worker added later.
            self._guarded(
                lambda: self.backend.publish_merged(round_, published, participants, step_of)
            )
        distances = {**others_distances, **{index_of[k]: d for k, d in own_distances.items()}}
        if len(participants) + len(left_out) > 1:  # a merge of one alone is no merge
            self.merges += 1
            merge = Merge(
                step=t.step,
                round=round_,
                participants=tuple(participants),
                left_out=dict(left_out),
                distances={w: round(d, 6) for w, d in sorted(distances.items())},
                merge_ms=round((time.perf_counter() - start) * 1000, 2),
                note="; ".join(notes),
            )
            self._log_merging(merge)
        self.set(merges=self.merges)

    def _sit_out(self, round_: int, own: list[int], others: list[int], start: float) -> None:
        """None of this process's merging workers is finite: each takes the pool's merged
        weights, with a new Adam. With other processes in the pool its file says so for the
        round (they go on without waiting for it) and it takes what they publish for the
        round (under a kept policy a worker's own, `_published`), else the pool's newest, as
        a process alone does. Like an added worker, they stay out of the mean until they
        update. With no merged weights at all the round is skipped and said so."""
        t, agent = self.trainer, self.trainer.agent
        try:
            if [w for w in others if w not in self.backend.down]:
                state = {k: v.detach().cpu() for k, v in agent.model_state(self.merging[0]).items()}
                got = self._guarded(
                    lambda: self.backend.sit_out(own[0], round_, state, t.step, tuple(own))
                )
            else:
                got = self.backend.newest_merged()
            weights = None if got is None else agent.checked_model_state(got.weights)
        except MergeCancelled:
            self._log_merging(MergeStopped(step=t.step, round=round_))
            raise StopTraining from None
        except WeightsError:  # weights of another model: nothing to take
            got = None
        reason = "own weights are not finite"
        if got is None:
            self._log_merging(MergeSkipped(step=t.step, round=round_, reason=reason))
            return
        agent.assign(weights, self.merging, self.merging)  # every one reset, none measured
        self.joined_updates = t.updates
        taking = f"took the pool's merged weights of round {got.round}"
        if got.round < round_:  # nobody merged this round with them: a round skipped
            reason = f"{reason}: {taking} (none of round {round_} came)"
            self._log_merging(MergeSkipped(step=t.step, round=round_, reason=reason))
            return
        self.merges += 1
        merge = Merge(
            step=t.step,
            round=round_,
            participants=got.participants,
            left_out={index: "non-finite weights" for index in own},
            distances={},
            merge_ms=round((time.perf_counter() - start) * 1000, 2),
            note=taking,
        )
        self._log_merging(merge)
        self.set(merges=self.merges)

    def _published(
        self, merged: State, rule: MergeRule, good: list[int], bad: list[int], sent: State | None
    ) -> State:
        """What the pool publishes (merged.pt): the merged weights, or with the policy kept
        a worker's weights as it holds them now (the lowest of this process's finite ones:
        its own policy with the world model it trained it with) for every consumer: the
        showcase, a worker added or restarted, a race's start, a promotion. A worker reset
        here for non-finite weights takes them too. A torchrun rank with no finite worker
        takes the job's lowest participant's as it holds them after the merge (`sent`: its
        own weights before it, from the rank holding it), never the mean's averaged policy."""
        agent = self.trainer.agent
        if rule.policy or (not good and sent is None):
            return {k: v.detach().cpu() for k, v in merged.items()}
        if good:
            own = agent.model_state(good[0])
            source = {k: v.detach().cpu().clone() for k, v in own.items()}
        else:
            source = {k: v.detach().cpu() for k, v in taken(sent, merged, rule).items()}
        if bad:
            agent.load_model_state(source, bad)
        return source

    def _log_merging(self, record: Record) -> None:
        """A record for the workers that merge (a control worker in the pack does not)."""
        for k in self.merging:
            self.trainer.members[k].log(record)

    def _guarded(self, write):
        """A merge file write, tried again while the disk is full (see DiskGuard.wait_for_disk)."""
        size = sum(t.numel() * t.element_size() for t in self.trainer.agent.model_state().values())
        return self.trainer.run_dir.guarded(self.backend.dir, size, write)
