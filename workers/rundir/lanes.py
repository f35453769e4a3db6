"""A race's lanes as a person asks for them (knob values, a size, merging on or off), dealt to
the run's workers and checked. Their values and merge pools live in the knob record
(knob_record.py), their merge files under merge/lane-L/ (paths.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.errors import ConfigError, printable
from agent.knobs import KnobValue, knob_text, knobs

Layout = tuple[tuple[int, ...], ...]  # the workers of each lane


@dataclass(frozen=True)
class Lane:
    """One lane: its knob changes (the others are the run's), its size (None: a share of the
    workers no lane sized) and whether its workers merge (merge=off: each trains alone, the
    control of a merging experiment)."""

    changes: dict[str, KnobValue] = field(default_factory=dict)
    size: int | None = None
    merges: bool = True


CONTROL = Lane(size=1, merges=False)  # --control-worker: one worker that never merges
OBS_LANE = (
    "lanes cannot differ in obs: a race compares settings on the same observations (its lanes "
    "start from, and promote, each other's weights); give --obs for the whole run"
)


def parse_lane(text: str) -> Lane:
    """A lane from "KEY=VALUE[,KEY=VALUE...]" (the command line's --lane, the window's
    dialogs): live knobs, `workers=N` (its size) and `merge=off`; an empty text is a lane with
    the run's values. ConfigError names the part that is wrong."""
    changes: dict[str, KnobValue] = {}
    size, merges, seen = None, True, set()
    table = knobs()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        if not sep or not key:
            raise ConfigError(f"{part!r} is not KEY=VALUE (e.g. iterations=2)", "lanes")
        if key in seen:
            raise ConfigError(f"{key} is given twice in one lane", key)
        seen.add(key)
        if key == "merge":
            if value not in ("on", "off"):
                raise ConfigError(f"merge must be on or off, got {value!r}", "lanes")
            merges = value == "on"
            continue
        if key == "workers":
            if not (value.isascii() and value.isdigit()) or int(value) < 1:
                raise ConfigError(f"workers must be a whole number of at least 1, got {value!r}")
            size = int(value)
            continue
        if key == "obs":
            raise ConfigError(OBS_LANE, key)
        if key not in table:
            raise ConfigError(
                f"{printable(key, 60)!r} is not a live knob, workers=N or merge=off (knobs: "
                f"{', '.join(table)})",
                key,
            )
        if table[key].kind is bool:
            if value not in ("on", "off"):
                raise ConfigError(f"{key} must be on or off, got {value!r}", key)
            changes[key] = value == "on"
            continue
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{key} must be a number, got {value!r}", key) from None
        changes[key] = table[key].check(int(number) if number.is_integer() else number)
    return Lane(changes, size, merges)


def check_lane(lane: Lane) -> None:
    """ConfigError unless `lane` is one parse_lane could have made: live knobs with values in
    range, a size of at least 1 worker or none, merging on or off (a lane that came as data,
    over the wire, gets the window's own refusal)."""
    if lane.size is not None and (type(lane.size) is not int or lane.size < 1):
        raise ConfigError(f"workers must be a whole number of at least 1, got {lane.size!r}")
    if type(lane.merges) is not bool:
        raise ConfigError(f"merge must be on or off, got {lane.merges!r}", "lanes")
    table = knobs()
    for key, value in lane.changes.items():
        if key == "obs":  # a lane sent as data: the command line's own refusal
            raise ConfigError(OBS_LANE, "obs")
        if not isinstance(key, str) or key not in table:
            raise ConfigError(
                f"{printable(key, 60)!r} is not a live knob (knobs: {', '.join(table)})", "lanes"
            )
        table[key].check(value)


def describe_lane(lane: Lane) -> str:
    """The inverse of parse_lane: "workers=4,iterations=2" ("" for the run's values)."""
    parts = [] if lane.size is None else [f"workers={lane.size}"]
    parts += [f"{k}={knob_text(v)}" for k, v in lane.changes.items()]
    parts += [] if lane.merges else ["merge=off"]
    return ",".join(parts)


def workers_for(lanes: Sequence[Lane], replicas: int = 1) -> int:
    """The workers a race of `lanes`, each run `replicas` times, takes when the run's count
    is not given: each lane its size, a lane without one a single worker."""
    return sum(lane.size or 1 for lane in lanes) * replicas


def replicate(lanes: Sequence[Lane], replicas: int) -> list[Lane]:
    """Each lane `replicas` times in a row (lane l's copy r at l * replicas + r): every copy a
    merge pool of its own, as the knob record keeps them."""
    check_replicas(replicas)
    return [lane for lane in lanes for _ in range(replicas)]


def check_replicas(replicas: object) -> None:
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ConfigError(
            f"replicas must be a whole number of at least 1 (copies of every lane), got "
            f"{replicas!r}",
            "replicas",
        )


def deal_lanes(workers: Sequence[int], lanes: Sequence[Lane], replicas: int = 1) -> Layout:
    """`workers` dealt in order into `lanes` (`replicas` copies of each race lane in a row):
    each sized lane its size, the others an even share of the rest (the first of them one more
    when it does not divide), so that a pack of neighbours stays in one lane. Every copy of a
    lane gets as many workers as the others: a rest that does not split into equal replicas is
    refused. ConfigError when the sizes do not fit the workers."""
    if not lanes:
        raise ConfigError("a race needs at least one lane, got none", "lanes")
    sized = sum(lane.size for lane in lanes if lane.size is not None)
    shares = sum(lane.size is None for lane in lanes)
    left = len(workers) - sized
    if left < 0 or (shares == 0 and left > 0):
        raise ConfigError(
            f"the lanes' sizes add up to {sized} workers and the run has {len(workers)}: "
            "they must add up (leave a lane's workers= out to give it the rest)",
            "lanes",
        )
    if left < shares:
        raise ConfigError(
            f"{len(lanes)} lanes need at least {sized + shares} workers "
            f"({sized} in sized lanes, one or more in each of the {shares} others), the run "
            f"has {len(workers)}",
            "lanes",
        )
    if left % replicas:
        raise ConfigError(
            f"the {left} workers left for the lanes without workers= do not split into "
            f"{replicas} equal replicas: give --workers a count that does (or each lane a "
            "workers=)",
            "lanes",
        )
    # Each race lane's share, then the same for each of its copies (they sit in a row).
    share, extra = divmod(left // replicas, shares // replicas) if shares else (0, 0)
    layout, at = [], 0
    for n, lane in enumerate(lanes):
        take = lane.size
        if take is None:
            take = share + (extra > 0)
            if n % replicas == replicas - 1:
                extra -= 1
        layout.append(tuple(workers[at : at + take]))
        at += take
    return tuple(layout)


def check_layout(lanes: Layout, workers: int, merging: Sequence[int], replicas: int = 1) -> None:
    """The one rule of a race's lanes in a run of `workers` workers, `merging` of them merging
    now: at least two race lanes, each with `replicas` copies; every copy has a worker, every
    worker named exists and is in one copy only, and each merging worker is in one. A knob
    record that breaks it (a hand edit, damage) is refused by every worker (hooks.py) and by the
    run (race/control.py), with run.json as each reads it."""
    if not lanes:
        return
    check_replicas(replicas)
    if len(lanes) % replicas or len(lanes) // replicas < 2:
        copies = f" in {replicas} replicas each" if replicas > 1 else ""
        raise ConfigError(
            f"a race needs at least 2 lanes{copies}, and the record has {len(lanes)} "
            f"lane{'s' * (len(lanes) != 1)}",
            "lanes",
        )
    seen: set[int] = set()
    for n, lane in enumerate(lanes):
        if not lane:
            raise ConfigError(f"lane {n} has no worker: each lane needs at least one", "lanes")
        for worker in lane:
            if not 0 <= worker < workers:
                raise ConfigError(
                    f"lane {n} names worker {worker}, and the run has workers 0-{workers - 1}",
                    "lanes",
                )
            if worker in seen:
                raise ConfigError(f"worker {worker} is in two lanes", "lanes")
            seen.add(worker)
    outside = [w for w in merging if w not in seen]
    if outside:
        raise ConfigError(f"worker {outside[0]} of the run is in no lane", "lanes")
