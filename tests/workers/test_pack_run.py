"""Packs in a run: K workers in one process, seen by the run directory as K workers."""

import json
import threading

import numpy as np
import pytest
import torch
from conftest import events, wait_until
from conftest import tiny_run as tiny

import workers.training.process as worker_module
from agent.errors import ConfigError, UserError
from workers.cli.headless import main
from workers.run.owner import Run, RunSettings
from workers.run.spawn import worker_spec
from workers.rundir.directory import load_state
from workers.rundir.records import Episode, Error, KnobsApplied, Merge, Resumed, Stop
from workers.training.process import does_not_fit
from workers.training.spec import DOES_NOT_FIT, SNAPSHOT_FIELDS, STATES, WorkerLink
from workers.training.trainer import Trainer


def test_pack_and_a_lone_worker_merge_apply_knobs_at_one_step_and_resume(tmp_path):
    # Workers 0 and 1 in a pack, worker 2 in its own process: the pack's mean goes through
    # the file merge weighing two workers.
    """A pack of 2 in one process and a lone worker in another merge through the files weighing 3
    workers, apply a knob at one step, and resume as a pack. Only real processes show two workers
    sharing a process yet each writing its own records and checkpoint."""
    settings = RunSettings(workers=3, pack=2, merge_every=100, merge_timeout_s=60)
    run = Run.create(tmp_path / "run", tiny(400), settings)
    assert run.settings.packs == [[0, 1], [2]]
    run.start()
    assert len({run.workers.procs[w].process.pid for w in (0, 1, 2)}) == 2
    assert wait_until(lambda: min(w["step"] for w in run.workers.progress()) >= 150)
    with pytest.raises(UserError, match="pack cannot shrink"):
        run.workers.remove(1)
    version = run.knobs.set(horizon=2)
    run.workers.wait()
    assert [w["state"] for w in run.workers.progress()] == ["done"] * 3
    applied = {w: [e for e in events(run, KnobsApplied, w) if e.version == version] for w in (0, 1)}
    assert applied[0] and applied[1]
    assert applied[0][0].step == applied[1][0].step  # both members at the same step
    for worker in (0, 1, 2):
        merges = events(run, Merge, worker)
        assert len(merges) >= 3 and all(m.participants == (0, 1, 2) for m in merges)
    pack_merges = events(run, Merge, 0)
    assert set(pack_merges[-1].distances) == {0, 1, 2}  # every worker, the lone one too
    # Each worker its own metrics, checkpoint and episodes.
    for worker in (0, 1, 2):
        assert events(run, Episode, worker)
        assert (run.path / "checkpoints" / f"worker-{worker}.pt").exists()

    resumed = Run.resume(run.path, steps=500)
    assert resumed.settings.packs == [[0, 1], [2]]
    resumed.start()
    resumed.workers.wait()
    for worker in (0, 1, 2):
        assert events(resumed, Resumed, worker)[0].step == 400
        assert events(resumed, Stop, worker)[-1].step == 500


def test_a_pack_merges_on_the_device_and_publishes_the_mean(tmp_path):
    # The run's last agent step (200) is a merge round: both workers end on the merged
    # weights, which merge/merged.pt holds too (for the showcase and workers added later).
    """A pack of 2 alone in one worker process merges on the device and publishes
    merge/merged.pt, both ending on the last round's mean: only a real run shows the published
    file equal to the weights each worker saved."""
    settings = RunSettings(workers=2, pack=2, merge_every=100, checkpoint_every=10**6)
    run = Run.create(tmp_path / "run", tiny(200), settings)
    run.start()
    run.workers.wait()
    merges = events(run, Merge, 0)
    assert [m.step for m in merges] == [100, 200]
    assert merges[0].distances[0] > 0 and merges[0].participants == (0, 1)
    merged = load_state(run.path / "merge" / "merged.pt")
    assert merged["participants"] == [0, 1] and merged["step"] == 200
    finals = [load_state(run.path / f"worker-{w}.pt")["model"] for w in (0, 1)]
    for name, value in merged["model"].items():
        for final in finals:
            assert torch.allclose(final[name], value.view_as(final[name]), atol=1e-6), name


def test_default_pack_on_a_cpu_is_one_process_per_worker(tmp_path):
    run = Run.create(tmp_path / "run", tiny(10), RunSettings(workers=3, pack=0))
    assert run.settings.pack == 1 and run.settings.packs == [[0], [1], [2]]
    record = json.loads((run.path / "run.json").read_text())
    assert record["pack"] == 1


def test_bad_pack_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(ConfigError, match="larger than the run's 2 workers"):
        RunSettings(workers=2, pack=3)
    with pytest.raises(ConfigError, match=r"pack must be 0 \(chosen when the run is created\)"):
        RunSettings(workers=2, pack=-1)  # (a run.json edited by hand: 0 is allowed there)
    assert RunSettings(workers=2, pack=0).pack == 0
    target = tmp_path / "run"
    flags = ["--headless", "--task=cartpole-balance", "--device=cpu", f"--run-dir={target}"]
    for extra, message in (
        (["--workers=2", "--pack=0"], "--pack must be at least 1"),
        (["--workers=2", "--pack=3"], "a pack of 3 is larger than the run's 2 workers"),
        (["--pack=2"], "a pack of 2 is larger than the run's 1 worker:"),
    ):
        assert main([*flags, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not target.exists()


def test_the_control_worker_can_be_a_pack_member_the_mean_skips(tmp_path):
    """A pack of 3 whose third member is the control worker: the mean skips it through every
    round and its saved weights stay its own. Only a real run of the pack's process shows the
    skip in what is saved."""
    settings = RunSettings(workers=3, control_worker=True, pack=3, merge_every=100)
    run = Run.create(tmp_path / "run", tiny(200), settings)
    assert run.settings.packs == [[0, 1, 2]] and run.settings.control_index == 2
    run.start()
    run.workers.wait()
    merges = events(run, Merge, 0)
    assert [m.participants for m in merges] == [(0, 1), (0, 1)]
    assert not events(run, Merge, 2)
    finals = [load_state(run.path / f"worker-{w}.pt")["model"] for w in (0, 1, 2)]
    same = [all(torch.equal(finals[0][k], other[k]) for k in finals[0]) for other in finals[1:]]
    assert same == [True, False]  # 1 was merged with 0 at the last step; 2 never was


def test_a_pack_out_of_gpu_memory_says_how_many_workers_fit(monkeypatch):
    # No GPU here: the numbers CUDA would give. 16 workers had taken 60 GiB when 20 GiB were
    # left: (60 + 20) / 60 * 16 = 21.3, so at most 20 fit.
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (20 * gib, 141 * gib))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 60 * gib)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    line = does_not_fit(16, torch.device("cuda"))
    assert "a pack of 16 workers does not fit in the memory of NVIDIA H200 (141.0 GiB" in line
    assert "at most about 20 fit" in line and "--pack 20" in line


def test_a_pack_out_of_gpu_memory_exits_with_that_line_and_records_it(
    monkeypatch, tmp_path, capsys
):
    """The worker process's own handling: exit code DOES_NOT_FIT (not restarted), the line on
    stderr and as each member's error record."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (20 * gib, 141 * gib))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 60 * gib)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(worker_module, "Trainer", out_of_memory)
    monkeypatch.setattr(worker_module, "child_signals", lambda: None)  # not in pytest itself
    monkeypatch.setattr(worker_module, "apply_threads", lambda threads: None)
    settings = RunSettings(workers=2, pack=2)
    run = Run.create(tmp_path / "run", tiny(100), settings)
    specs = [worker_spec(run.path, run.cfg, settings, k, 100) for k in (0, 1)]
    links = [
        WorkerLink(spec, [0.0] * len(SNAPSHOT_FIELDS), threading.Event(), threading.Event())
        for spec in specs
    ]
    with pytest.raises(SystemExit) as exited:
        worker_module.worker_main(links, threading.Event(), threading.Event())
    assert exited.value.code == DOES_NOT_FIT
    line = capsys.readouterr().err.strip()
    assert line.startswith("workers 0, 1 (a pack): a pack of 2 workers does not fit"), line
    for k in (0, 1):
        errors = [e for e in events(run, Error) if e.worker == k]
        assert len(errors) == 1 and "at most about" in errors[0].message
    assert [link.value("state") for link in links] == [STATES.index("crashed")] * 2


def test_a_trainer_pack_resumes_every_member_from_its_checkpoint():
    cfg = tiny(30, seed_steps=20, episode_length=10)
    seeds = [7, 8]
    first = Trainer(cfg, None, progress=False, seeds=seeds)
    first.run()
    assert first.updates > 0
    states = [first.state_dict(worker=k) for k in range(len(seeds))]
    key = "encoder.layers.0.weight"
    assert not torch.equal(states[0]["agent"]["model"][key], states[1]["agent"]["model"][key])

    resumed = Trainer(cfg, None, progress=False, seeds=seeds)
    try:
        for k in reversed(range(len(seeds))):
            resumed.load_state_dict(states[k], worker=k)
        a, b = first.agent, resumed.agent
        assert (resumed.step, resumed.updates) == (first.step, first.updates)
        for name, value in a.model.state_dict().items():
            assert torch.equal(b.model.state_dict()[name], value), name
        for mine, theirs in ((a.optim, b.optim), (a.pi_optim, b.pi_optim)):
            ours, loaded = mine.state_dict()["state"], theirs.state_dict()["state"]
            assert ours.keys() == loaded.keys() and ours
            for i, entry in ours.items():
                for name, value in entry.items():
                    assert torch.equal(loaded[i][name], value), (i, name)
        for k, (m, r) in enumerate(zip(first.members, resumed.members)):
            assert torch.equal(b.noise.get_state(k), a.noise.get_state(k)), k
            assert m.rng.bit_generator.state == r.rng.bit_generator.state, k
            ours, loaded = m.buffer.state_dict(), r.buffer.state_dict()
            for name, value in ours.items():
                if isinstance(value, torch.Tensor):
                    assert torch.allclose(loaded[name], value, rtol=0, atol=0, equal_nan=True), (
                        k,
                        name,
                    )
                else:
                    assert loaded[name] == value, (k, name)

        # The same further work gives the same results (the global stream: dropout).
        obs = torch.randn(len(seeds), 1, first.env.single_observation_space.shape[0])
        results = []
        for trainer in (first, resumed):
            torch.manual_seed(123)
            infos = [trainer.agent.update(trainer._sample()) for _ in range(3)]
            action = trainer.agent.act(obs, t0=True)
            draws = [m.rng.uniform(-1, 1, 4) for m in trainer.members]
            results.append((infos, action, draws, trainer.agent.model.state_dict()))
        (infos_a, act_a, draws_a, model_a), (infos_b, act_b, draws_b, model_b) = results
        for x, y in zip(infos_a, infos_b):
            assert all(torch.equal(x[name], y[name]) for name in x)
        assert torch.equal(act_a, act_b)
        assert all(np.array_equal(x, y) for x, y in zip(draws_a, draws_b))
        assert all(torch.equal(model_a[name], model_b[name]) for name in model_a)
    finally:
        resumed.env.close()
