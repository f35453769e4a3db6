"""The merge rule a pool uses in each round, the same in every process of the pool:
merge/[lane-L/]rule.json.

A knob change reaches the processes of a pool at different agent steps, so one process could
merge a round under the new rule while another still merges it under the old one (an outer step
against a plain mean, a policy kept against one averaged). So the rule of a round is the pool's:
the first process that comes to round r's merge writes the rule it runs with for r, and every
process of the pool merges round r under that rule, whatever its own knobs say by then. A change
thus takes effect at one round in every process: the first round whose first process has it.
The file keeps the newest few rounds (a process a round behind still finds its round's rule).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.errors import ConfigError
from agent.knobs import knobs
from agent.pack.merge_rule import MergeRule
from workers.rundir.directory import LOCK_TIMEOUT_S, DirLock, atomic_write_json

RULE = "rule.json"
KEPT_ROUNDS = 8  # rounds the file remembers: a process further behind takes its own rule


@dataclass(frozen=True)
class RuleHistory:
    """What the pool's rule file remembers of the rounds before one: whether each kept round
    merged under the outer step, and whether older rounds were let go of (the file is full)."""

    outer: dict[int, bool]
    full: bool = False

    def breaks(self, saved: int) -> str:
        """Why the outer state of round `saved` is no anchor to go on from ("": it is one):
        a round merged without the outer step since, or more merged rounds since than the
        file remembers. Rounds counted in numbers alone say nothing: a step of many envs
        skips many."""
        plain = [r for r, outer in self.outer.items() if r > saved and not outer]
        if plain:
            return f"rounds without the outer step since its round {saved} (round {max(plain)})"
        if self.full and self.outer and min(self.outer) > saved:
            return f"its state is of round {saved}, more than {KEPT_ROUNDS} merge rounds back"
        return ""


class PoolRule:
    """The rule of each round of one pool, kept in `folder` (the pool's merge folder)."""

    def __init__(self, folder: Path, pool: int, timeout_s: float = LOCK_TIMEOUT_S):
        self.path, self.pool, self.timeout_s = Path(folder) / RULE, pool, timeout_s

    def for_round(self, round_: int, own: MergeRule) -> tuple[MergeRule, str]:
        """(the pool's rule for round `round_`, a note when it is not `own` or not known):
        the rule written for the round, else `own`, written for it."""
        try:
            with DirLock(str(self.path) + ".lock", timeout=self.timeout_s):
                rounds = self._read()
                found = rounds.get(round_)
                if found is not None:
                    if found == own:
                        return found, ""
                    return found, f"the pool's rule for round {round_} (this process's from later)"
                rounds[round_] = own
                newest = sorted(rounds)[-KEPT_ROUNDS:]
                entries = {str(r): asdict(rounds[r]) for r in newest}
                atomic_write_json(self.path, {"pool": self.pool, "rounds": entries})
                return own, ""
        except TimeoutError:
            return own, f"the pool's rule file stayed locked for {self.timeout_s:g} s: own rule"

    def history(self, round_: int) -> RuleHistory:
        """The rounds before `round_` the file keeps, each said as outer step or not."""
        try:
            with DirLock(str(self.path) + ".lock", timeout=self.timeout_s):
                rounds = self._read()
        except TimeoutError:
            rounds = {}
        kept = {r: rule.outer for r, rule in rounds.items() if r < round_}
        return RuleHistory(kept, full=len(rounds) >= KEPT_ROUNDS)

    def _read(self) -> dict[int, MergeRule]:
        """This pool's rules by round ({} when none, another pool's, or damaged)."""
        try:
            data = json.loads(self.path.read_text())
            if int(data["pool"]) != self.pool:
                return {}
            return {int(r): _checked(rule) for r, rule in dict(data["rounds"]).items()}
        except (OSError, ValueError, KeyError, TypeError):  # ConfigError is a ValueError
            return {}


def _checked(entry: dict) -> MergeRule:
    """A rule as written, its values in their knobs' ranges (ConfigError if not)."""
    table = knobs()
    rule = MergeRule(
        table["merge_pull"].check(entry["pull"]),
        table["outer_lr"].check(entry["outer_lr"]),
        table["outer_momentum"].check(entry["outer_momentum"]),
        table["merge_policy"].check(entry["policy"]),
    )
    if rule.pull != 1.0 and rule.outer:
        raise ConfigError("a pull with the outer step")
    return rule
