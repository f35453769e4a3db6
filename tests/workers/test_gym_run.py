"""Gymnasium envs in a run of merged workers: a user's own env reached as `module:EnvId`, and
one of gymnasium's MuJoCo tasks, end to end through merges, checkpoints and a resume."""

from conftest import TINY_FLAGS, events
from conftest import tiny_run as tiny

from workers.cli.flags import build_parser
from workers.cli.new_run import config_from_args
from workers.run.owner import Run, RunSettings
from workers.rundir.album import worker_entries
from workers.rundir.directory import load_state
from workers.rundir.paths import checkpoint_path
from workers.rundir.records import Episode, Merge, Resumed, Stop

SLIDE = "helpers.slide_env:Slide-v0"


def test_a_users_env_trains_in_two_merging_workers_with_its_terminations(tmp_path):
    # A short rail: an untrained policy falls off it in most episodes (on the default rail of
    # 1, a run of 300 steps may see no fall at all). Seed 159: worker 0's first episode (random
    # seed-step actions) falls off on its 40th step, the time limit's: terminated and truncated
    # at once, a termination.
    """A user's env (`module:EnvId`) trains in two merging spawned workers; its terminations
    reach the episodes and the checkpointed buffer, a fall on the time limit's step included.
    Only worker processes show the user's module imported by a fresh interpreter."""
    cfg = tiny(
        300,
        task=SLIDE,
        env_kwargs='{"rail": 0.3}',
        action_repeat=1,
        episode_length=40,
        episodic=True,
        seed_steps=80,
        seed=159,
    )
    run = Run.create(
        tmp_path / "run", cfg, RunSettings(workers=2, merge_every=100, merge_timeout_s=120)
    )
    run.start()
    run.workers.wait()
    assert [w["state"] for w in run.workers.progress()] == ["done", "done"]
    for worker in (0, 1):
        episodes = events(run, Episode, worker)
        assert any(e.terminated for e in episodes)
        buffer = load_state(checkpoint_path(run.path, worker))["buffer"]
        check_terminations(episodes, buffer, limit=40)
        merges = events(run, Merge, worker)
        assert len(merges) >= 2 and all(m.participants == (0, 1) for m in merges)
    first = events(run, Episode, 0)[0]
    assert (first.length, first.terminated) == (40, True), "the seed's fall on the last step"


def check_terminations(episodes: list[Episode], buffer: dict, limit: int) -> None:
    """A worker's episode records against its checkpointed buffer (episode i of the records is
    the buffer's episode i): an episode ends in a termination exactly where the Slide env fell
    off its rail (its reward -1 on that step, any other step's in [0, 1]), at any length up to
    the time limit (a fall on the limit's own step is a termination too); every other episode
    is cut by the time limit. One terminal row in the buffer per terminated episode it holds."""
    ids, terminal, reward = buffer["episode"], buffer["terminated"][:, 0], buffer["reward"][:, 0]
    assert int(ids.max()) == len(episodes) - 1, "a record for each episode of the buffer"
    oldest, held = int(ids[ids >= 0].min()), 0
    for number, episode in enumerate(episodes):
        assert episode.length <= limit
        if not episode.terminated:
            assert episode.length == limit, "only a fall ends an episode before the time limit"
        rows = set((ids == number).nonzero()[:, 0].tolist())
        if not rows:  # the oldest episodes may have left the ring
            continue
        # Whole, or the oldest one held, its first rows overwritten: its last is kept.
        assert len(rows) == episode.length + 1 or number == oldest, (number, episode)
        last = next(r for r in rows if (r + 1) % len(ids) not in rows)
        fell = float(reward[last]) == -1.0
        assert episode.terminated == fell == bool(terminal[last]), (number, episode)
        held += episode.terminated
    assert int(terminal.sum()) == held


def test_inverted_pendulum_runs_merges_checkpoints_and_resumes(tmp_path):
    """A gymnasium MuJoCo task through two merging worker processes, their checkpoints and a
    resume: only real workers show gymnasium's env made, stepped and resumed in spawned
    processes."""
    args = build_parser().parse_args(
        [f for f in TINY_FLAGS if not f.startswith(("--task", "--episode-length"))]
        + ["--task=InvertedPendulum-v5", "--steps=240", "--seed-steps=60"]
    )
    cfg = config_from_args(args)
    # What the task brought: its own repeat, the episodes of its time limit, episodic mode.
    assert (cfg.action_repeat, cfg.episode_length, cfg.episodic) == (1, 1000, True)
    run = Run.create(tmp_path / "run", cfg, RunSettings(workers=2, merge_every=80))
    run.start()
    run.workers.wait()
    for worker in (0, 1):
        episodes = events(run, Episode, worker)
        assert episodes and all(e.terminated for e in episodes)  # an untrained pole falls
        assert {m.participants for m in events(run, Merge, worker)} == {(0, 1)}
        assert checkpoint_path(run.path, worker).exists()
        album = worker_entries(run.path, worker)  # a gymnasium MuJoCo task's album: its poses
        assert album and album[0].load().states.shape[1] == 2  # the cart and the hinge
    resumed = Run.resume(run.path, steps=320)
    resumed.start()
    resumed.workers.wait()
    for worker in (0, 1):
        assert events(resumed, Resumed, worker)[0].step == 240
        assert events(resumed, Stop, worker)[-1].step == 320
        assert worker_entries(run.path, worker)[-1].step > 240, "the album goes on after a resume"
