"""When a fresh run's first update comes, and a warning when its steps end before it."""

from __future__ import annotations

from agent.config import Config


def first_update_step(cfg: Config) -> int | None:
    """The agent step of the first update of a fresh run (None: never). Updates begin after
    the seed steps, once the buffer holds a whole episode longer than the horizon (the tasks
    here end on time, so each env's first episode ends after episode_length steps)."""
    if cfg.episode_length < cfg.horizon:
        return None
    n = cfg.num_envs
    ready = max(cfg.resolved_seed_steps, n * cfg.episode_length)
    return -(-ready // n) * n  # steps advance by num_envs


def steps_warning(cfg: Config) -> str | None:
    """A warning line when `cfg.steps` ends before the first update, else None."""
    first = first_update_step(cfg)
    if first is None:
        return (
            f"warning: episodes of {cfg.episode_length} steps are shorter than the horizon "
            f"({cfg.horizon}): the agent will never update"
        )
    if -(-cfg.steps // cfg.num_envs) * cfg.num_envs >= first:
        return None
    return (
        f"warning: {cfg.steps} steps end before the first update, at step {first} (after the "
        f"{cfg.resolved_seed_steps} seed steps, once a whole {cfg.episode_length}-step episode "
        "is in the buffer): the agent will not learn; raise --steps or lower --seed-steps"
    )
