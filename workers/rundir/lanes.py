"""A race's lanes: which merging workers race together, dealt and checked. Their values and
merge pools live in the knob record (knob_record.py), their merge files under merge/lane-L/
(paths.py)."""

from __future__ import annotations

from agent.errors import ConfigError
from agent.knobs import knobs


def deal_lanes(workers: list[int], count: int) -> tuple[tuple[int, ...], ...]:
    """`workers` dealt in order into `count` lanes as even as can be (the first lanes one more
    when they do not divide), so that a pack of neighbours stays in one lane."""
    if count < 1:
        raise ConfigError(f"a race needs at least one lane, got {count}", "lanes")
    if count > len(workers):
        raise ConfigError(
            f"{count} lanes need at least {count} merging workers, the run has {len(workers)}",
            "lanes",
        )
    size, extra = divmod(len(workers), count)
    lanes, at = [], 0
    for n in range(count):
        take = size + (n < extra)
        lanes.append(tuple(workers[at : at + take]))
        at += take
    return tuple(lanes)


def check_lanes(lanes: tuple[tuple[int, ...], ...], merging: list[int]) -> None:
    """ConfigError unless every lane has a worker and each worker (a merging one) is in at
    most one lane."""
    seen: set[int] = set()
    for n, lane in enumerate(lanes):
        if not lane:
            raise ConfigError(f"lane {n} has no worker: each lane needs at least one", "lanes")
        for worker in lane:
            if worker in seen:
                raise ConfigError(f"worker {worker} is in two lanes", "lanes")
            if worker not in merging:
                raise ConfigError(
                    f"worker {worker} cannot race: it is not a merging worker of the run "
                    f"(those: {merging})",
                    "lanes",
                )
            seen.add(worker)


def parse_lane(text: str) -> dict[str, int | float]:
    """A lane's knob changes from "KEY=VALUE[,KEY=VALUE...]" (the command line's --lane, the
    window's race dialog); an empty text is a lane with the run's values. ConfigError names
    the part that is wrong: an unknown knob, a value that is not a number or out of range."""
    changes: dict[str, int | float] = {}
    table = knobs()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"{part!r} is not KEY=VALUE (e.g. iterations=2)", "lanes")
        if key not in table:
            raise ConfigError(f"{key!r} is not a live knob (knobs: {', '.join(table)})", key)
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{key} must be a number, got {value.strip()!r}", key) from None
        if key in changes:
            raise ConfigError(f"{key} is given twice in one lane", key)
        changes[key] = table[key].check(int(number) if number.is_integer() else number)
    return changes


def describe_lane(changes: dict[str, int | float]) -> str:
    """The inverse of parse_lane: "iterations=2,horizon=3" ("" for the run's values)."""
    return ",".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in changes.items()
    )
