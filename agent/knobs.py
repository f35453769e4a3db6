"""The live knobs: one declaration each, from which everything else is derived.

Validation (agent/config.py for the agent's, workers/rundir/knob_record.py for the run's),
the knob record in the run directory, the command line's help, and the window's widgets and
labels all read this table. Adding a knob is a line here, the Config field it sets (or the run
setting, for the workers' layer) and its use: for a planner knob, a field of PlanKnobs
(agent/planner.py), which TDMPC2.plan_knobs fills from the Config by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from agent.errors import ConfigError

KnobValue = int | float | bool  # bool: an on/off knob (JSON reads it back as true/false)


@dataclass(frozen=True)
class Knob:
    name: str
    """The Config field (layer "agent") or run setting (layer "workers") it sets."""
    kind: type
    """int, float or bool (on or off: low 0, high 1)."""
    low: float
    """Smallest value allowed (inclusive)."""
    high: float
    """Largest value allowed (inclusive)."""
    label: str
    """What the window calls it."""
    unit: str = ""
    """Shown after the label, in brackets."""
    layer: str = "agent"
    """Who applies it: "agent" (through the Config: the planner, the trainer, the merge rule) or
    "workers" (the merge frequency, in the worker process)."""
    step: int = 0
    """In the window: 0 a slider; > 0 a number field stepping by this much (wide ranges)."""
    in_window: bool = True
    """Whether the window has a widget for it (all are in the record and the command line)."""
    auto: int | None = None
    """A value a Config may hold instead, meaning "chosen from the task when the run starts"
    (never a live value: the record holds what was chosen)."""

    @property
    def bounds(self) -> str:
        """ "[low, high]" as a person reads it (no 1e+07 for a whole number; "on or off")."""
        if self.kind is bool:
            return "on or off"
        low, high = (f"{v:g}" if self.kind is float else str(int(v)) for v in (self.low, self.high))
        return f"[{low}, {high}]"

    @property
    def title(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def check(self, value: object) -> KnobValue:
        """The value as this knob's type, or ConfigError naming the knob and its range. An on/off
        knob takes True or False (1 and 0 too: a JSON reader's or a slider's)."""
        if self.kind is bool:
            if value in (0, 1) and isinstance(value, (bool, int, float)):
                return bool(value)
            raise ConfigError(f"{self.name} must be on or off, got {value!r}", self.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.name} must be a number, got {value!r}", self.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{self.name} must be a finite number, got {value}", self.name)
        if self.kind is int and value != int(value):
            raise ConfigError(f"{self.name} must be a whole number, got {value!r}", self.name)
        if not self.low <= value <= self.high:
            raise ConfigError(f"{self.name} must be in {self.bounds}, got {value}", self.name)
        return self.kind(value)


# The window shows them in this order.
KNOBS: tuple[Knob, ...] = (
    Knob("merge_every", int, 1, 10_000_000, "merge every", "steps", layer="workers", step=500),
    Knob("horizon", int, 1, 16, "planning horizon"),
    Knob("iterations", int, 1, 32, "MPPI iterations", auto=0),
    Knob("num_samples", int, 2, 8192, "MPPI samples", step=64),
    Knob("num_elites", int, 1, 1024, "elites", step=8),
    Knob("num_pi_trajs", int, 0, 1024, "policy trajectories"),
    Knob("steps_per_update", int, 1, 64, "steps per update"),
    Knob("updates_per_step", int, 1, 16, "updates per step"),
    Knob("temperature", float, 1e-3, 100.0, "MPPI temperature", in_window=False),
    Knob("merge_pull", float, 1e-3, 1.0, "merge pull"),
    Knob("outer_lr", float, 1e-2, 2.0, "outer learning rate"),
    Knob("outer_momentum", float, 0.0, 0.99, "outer momentum"),
    Knob("merge_policy", bool, 0, 1, "merge the policy"),
    Knob("bf16", bool, 0, 1, "bf16 numbers (CPU)"),
)


def knobs(layer: str | None = None) -> dict[str, Knob]:
    """The knobs (of one layer), by name, in the table's order. Read at call time, so that a
    knob added to the table is seen everywhere."""
    return {k.name: k for k in KNOBS if layer in (None, k.layer)}


def knob_text(value: int | float | bool) -> str:
    """A knob's value as a person writes it: on/off, 0.7, 1000000 (not 1e+06)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


class KnobValues(Mapping[str, KnobValue]):
    """Live-knob values, frozen, each checked against the table when made (unknown names and
    out-of-range values are a ConfigError): whoever holds one holds values in range. The
    checks that need the rest of the config (num_elites <= num_samples, ...) are made where
    values enter a run (workers/rundir/knob_record.py validate_knobs), which returns this type."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, object]):
        table = knobs()
        unknown = sorted(set(values) - set(table))
        if unknown:
            raise ConfigError(f"not a live knob: {', '.join(unknown)} (knobs: {', '.join(table)})")
        checked = {name: table[name].check(value) for name, value in values.items()}
        object.__setattr__(self, "_values", checked)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("knob values are frozen: validate new ones")

    def __getitem__(self, name: str) -> KnobValue:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"KnobValues({self._values!r})"

    def __reduce__(self) -> tuple:
        return KnobValues, (dict(self._values),)
