"""A run's live knobs, owned or attached alike: the values in force and new ones.

The knob record itself (validated, versioned, atomic) is workers/rundir/knob_record.py's
KnobStore, `store` here; this adds what only a run knows: the values its workers last recorded
applying, the fallback for a record damaged beyond its history.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.config import Config
from agent.errors import ConfigError
from workers.run.tail import tail_records
from workers.rundir.knob_record import KnobStore, run_knobs, validate_knobs
from workers.rundir.paths import metrics_name
from workers.rundir.records import KnobsApplied, KnobsRefused
from workers.rundir.settings import RunSettings


class RunKnobs:
    """`run.knobs`: read and set the knobs of one run."""

    def __init__(self, store: KnobStore, cfg: Config, settings: Callable[[], RunSettings]):
        """`settings`: the run's settings now (workers come and go)."""
        self.store, self.cfg, self.settings = store, cfg, settings
        self.run_path = store.path.parent

    def values(self) -> tuple[int, dict]:
        """(version, values) of the knobs in force: the knob record, or if it is damaged the
        newest good version of its history, else what the workers last recorded applying,
        else the run's own starting values."""
        good = self.store.last_good(self.cfg)
        return good if good is not None else self.applied()

    def merge_every(self) -> int:
        """The merge frequency in force (steps)."""
        return int(self.values()[1]["merge_every"])

    def applied(self) -> tuple[int, dict]:
        """The newest knob values a worker recorded running with (knobs_applied, or the values
        in force when it refused a record), else the run's starting values."""
        settings = self.settings()
        best = (-1, run_knobs(self.cfg, settings.merge_every))
        for index in settings.active:
            for record in reversed(tail_records(self.run_path / metrics_name(index))):
                if isinstance(record, KnobsApplied):
                    found = (record.version, record.values)
                elif isinstance(record, KnobsRefused):
                    found = (record.in_force_version, record.in_force)
                else:
                    continue
                if found[0] > best[0]:
                    try:
                        best = (found[0], validate_knobs(self.cfg, found[1]))
                    except ConfigError:
                        pass
                break
        return best

    def set(self, lane: int | None = None, **changes: object) -> int:
        """Validate and publish new knob values, for lane `lane` of a race or (None) for every
        worker; returns the new version (error: unchanged). A damaged knob record is replaced,
        from the values in force (only then are the workers' metrics files read for them)."""
        return self.store.set(self.cfg, in_force=self.applied, lane=lane, **changes)
