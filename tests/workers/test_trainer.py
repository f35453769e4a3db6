"""The training loop in-process: update ratio with vectorised envs, run directory contents."""

from workers.rundir.directory import RunDir, load_state
from workers.rundir.records import Episode, Eval
from workers.training.trainer import Trainer


def test_vectorised_training_keeps_the_update_ratio(tiny_cfg, tmp_path):
    cfg = tiny_cfg.__class__(
        **{
            **tiny_cfg.__dict__,
            "num_envs": 2,
            "steps_per_update": 4,
            "episode_length": 20,
            "seed_steps": 40,
            "steps": 120,
            "eval_every": 60,
            "eval_episodes": 1,
        }
    )
    run = RunDir.create(tmp_path / "run")
    summary = Trainer(cfg, run, progress=False).run()
    assert summary["steps"] == 120
    # 40 pretraining updates at step 40, then 2 env steps per vector step at 1 update per 4.
    assert summary["updates"] == 40 + (120 - 40) // 4
    episodes = RunDir(tmp_path / "run").read_metrics(Episode)
    assert sorted({e.env for e in episodes}) == [0, 1]
    assert len(episodes) == 120 // 20 and all(e.length == 20 for e in episodes)
    assert [e.step for e in RunDir(tmp_path / "run").read_metrics(Eval)] == [60, 120]
    state = load_state(run.weights_path)
    assert state["format"] == "tdmpc2-live/agent/1"


def test_torn_metrics_line_is_skipped(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.log(Episode(step=1, ret=2.0, length=1))
    run.close()
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "episode", "st')
    assert [r.ret for r in RunDir(tmp_path / "run").read_metrics()] == [2.0]


def test_updates_per_step_sets_the_update_to_data_ratio(tiny_cfg, tmp_path):
    """3 updates per 2 environment steps after pretraining: 1.5 updates a step, the credit's
    fractions carried over (the data-parallel baseline: N updates on one worker's data)."""
    cfg = tiny_cfg.__class__(
        **{
            **tiny_cfg.__dict__,
            "steps_per_update": 2,
            "updates_per_step": 3,
            "episode_length": 20,
            "seed_steps": 40,
            "steps": 80,
            "eval_every": 0,
        }
    )
    summary = Trainer(cfg, RunDir.create(tmp_path / "run"), progress=False).run()
    assert summary["updates"] == 40 + (80 - 40) * 3 // 2
