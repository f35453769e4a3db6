"""The progress display: phases in the right order, returns, totals; the too-few-steps warning."""

import io

import pytest
import torch
from conftest import tiny_config

from workers.rundir.directory import RunDir
from workers.training.progress import Progress, WorkersProgress, phase_text, worker_text
from workers.training.schedule import first_update_step, steps_warning
from workers.training.trainer import Trainer


@pytest.fixture(autouse=True)
def one_thread():
    # Trainers here run on a machine other tests load too: one thread, as the policy gives.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_phase_text_counts_updates_and_episodes():
    assert phase_text("pretraining", 150, 1000) == "pretraining 150/1000 updates"
    assert phase_text("evaluating", 2, 10) == "evaluating 2/10 episodes"
    assert phase_text("training") == "training"


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    progress = Progress(1000, stream=out, every_s=0)
    progress.phase("seeding")
    progress.show(100)
    progress.set(episode_return=12.5)
    progress.phase("pretraining", 10, 200)
    progress.show()
    progress.phase("training")
    progress.set(eval_return=44.0)
    progress.show(500)
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert "100/1000" in lines[0] and lines[0].endswith("seeding]")
    assert lines[1].endswith("pretraining 10/200 updates | return 12.5]")
    assert "500/1000" in lines[2] and lines[2].endswith("training | return 12.5 | eval 44.0]")
    assert len(lines) == 3  # closing repeats nothing


def test_plain_lines_are_spaced_out():
    out = io.StringIO()
    progress = Progress(1000, stream=out, every_s=3600)
    progress.phase("training")
    for step in range(1, 200):
        progress.show(step)
    assert len(out.getvalue().splitlines()) == 1  # the first; the next is due in an hour


def test_a_terminal_gets_one_redrawn_bar():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    progress = Progress(100, stream=out, every_s=0)
    progress.phase("training")
    progress.show(50)
    progress.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and "\r" in text
    assert "50/100" in text and "training" in text


def test_multi_worker_line_has_totals_and_each_worker():
    out = io.StringIO()
    progress = WorkersProgress(1000, 200, stream=out, every_s=0)
    nan = float("nan")
    rows = [
        dict(worker=0, state="training", step=300, last_return=12.0, updates=400),
        dict(worker=1, state="pretraining", step=200, last_return=nan, updates=50),
        dict(worker=2, state="starting", step=0, last_return=0.0, updates=0),
    ]
    progress.update(rows)
    progress.close()
    line = out.getvalue().strip()
    assert "500/3000" in line
    assert line.endswith("w0 training 12.0, w1 pretraining 50/200, w2 starting]")
    assert worker_text(dict(worker=3, state="done", last_return=-1.25), 200) == "w3 done -1.2"


def run_with_progress(run_dir, **overrides):
    cfg = tiny_config(**overrides)
    trainer = Trainer(cfg, RunDir.create(run_dir), progress=False)
    out = io.StringIO()
    trainer.progress = Progress(cfg.steps, stream=out, every_s=0)
    summary = trainer.run()
    # The status follows the rate: "..., 12.3step/s, PHASE | return R | eval E]".
    statuses = [line.rsplit(", ", 1)[-1].rstrip("]") for line in out.getvalue().splitlines()]
    return summary, [status.split(" | ")[0].split(" (")[0] for status in statuses]


def test_phases_of_a_run_in_order(tmp_path):
    summary, phases = run_with_progress(
        tmp_path / "run", steps=140, seed_steps=60, episode_length=50, eval_every=0, eval_episodes=2
    )
    assert summary["updates"] > 60
    names = [p.split(" ")[0] for p in phases]
    # Each phase once, in this order (seeding did not come back after it ended).
    order = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert order == ["seeding", "pretraining", "training", "evaluating", "saving", "done"], order
    assert "pretraining 60/60 updates" in phases[names.index("training") - 1]
    assert [p for p in phases if p.startswith("evaluating")][-1] == "evaluating 2/2 episodes"
    assert "evaluating 1/2 episodes" in phases


def test_first_update_step():
    cfg = tiny_config(seed_steps=60, episode_length=50)
    assert first_update_step(cfg) == 60
    assert first_update_step(tiny_config(seed_steps=20, episode_length=50)) == 50  # an episode
    assert first_update_step(tiny_config(seed_steps=61, episode_length=50, num_envs=2)) == 100
    assert first_update_step(tiny_config(seed_steps=101, episode_length=50, num_envs=2)) == 102
    assert first_update_step(tiny_config(episode_length=2, horizon=3)) is None


@pytest.mark.parametrize(
    "steps, num_envs, learns",
    [(60, 1, True), (59, 1, False), (99, 2, True), (98, 2, False)],
)
def test_warning_says_exactly_when_no_update_comes(steps, num_envs, learns):
    # First update: step 60 with one env; with two, once each env's first 50-step episode is
    # in (step 100), and 99 steps run to step 100 (steps advance by 2).
    cfg = tiny_config(
        steps=steps,
        seed_steps=60,
        episode_length=50,
        num_envs=num_envs,
        eval_every=0,
        eval_episodes=1,
    )
    warning = steps_warning(cfg)
    assert (warning is None) == learns
    if not learns:
        assert f"{steps} steps end before the first update" in warning
    summary = Trainer(cfg, progress=False).run()
    assert (summary["updates"] > 0) == learns
