"""The learning montage (workers/showcase/montage*.py, workers/cli/montage.py): an MP4 of album
episodes in step order, each at 1x then held; a race's lanes tiled; every bad input one line,
exit 2, and no file; an interrupted one leaves nothing; the window's command renders it in a
process of its own and says where. Synthetic albums of real cartpole poses, tiny frames."""

import os
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from conftest import tiny_run
from helpers.album_run import episode_poses, make_album_run

from agent.errors import UserError
from workers.cli.montage import main
from workers.run.commands import MakeMontage
from workers.run.owner import Run
from workers.rundir.album import keep_in_album
from workers.rundir.replays import EpisodeReplay
from workers.rundir.settings import RunSettings
from workers.showcase.montage import FPS, render_montage, segment_frames, total_frames
from workers.showcase.montage_plan import pick_evenly, plan_montage

ROOT = Path(__file__).resolve().parents[2]
TINY = (48, 64)  # (height, width) of a tile
LENGTHS = (5, 20, 40)  # agent steps of the album's episodes, at steps 100, 200, 300


@pytest.fixture(scope="module")
def album(tmp_path_factory) -> Path:
    # The cart far left, centre, far right: an episode's start is a jump in the video.
    path = tmp_path_factory.mktemp("album") / "run"
    return make_album_run(path, lengths=LENGTHS, shifts=(-1.5, 0.0, 1.5))


@pytest.fixture(scope="module")
def race(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("race") / "run"
    return make_album_run(path, lengths=(5, 10), workers=2, lanes=((0,), (1,)))


def frames_of(path: Path) -> np.ndarray:
    return np.stack(list(iio.imiter(path)))


def test_episodes_are_chosen_evenly_first_and_last_included():
    entries = list(range(10))
    assert pick_evenly(entries, 4) == [0, 3, 6, 9]
    assert pick_evenly(entries, 1) == [9], "one episode: the newest"
    assert pick_evenly(entries[:3], 8) == [0, 1, 2], "fewer than asked: all"


def test_each_episode_plays_at_1x_then_holds_in_step_order(album, tmp_path):
    plan = plan_montage(album, episodes=8)
    assert [ep.step for ep in plan.tiles[0].episodes] == [100, 200, 300]
    assert [len(ep.rewards) for ep in plan.tiles[0].episodes] == list(LENGTHS)
    seen = []
    out = render_montage(plan, tmp_path / "m.mp4", TINY, progress=lambda d, t: seen.append(d))
    frames = frames_of(out)
    segments = [segment_frames([ep], FPS) for ep in plan.tiles[0].episodes]
    # 1x: an episode of T steps of 0.02 s lasts T x 0.02 s, its last pose then held 0.5 s.
    assert segments == [int(n * 0.02 * FPS) + 1 + FPS // 2 for n in LENGTHS]
    assert len(frames) == sum(segments) == total_frames(plan) == seen[-1]
    assert frames.shape[1:] == (*TINY, 3)
    # Where the cart jumps is where an episode starts: after 5 steps held, then after 20.
    change = np.abs(np.diff(frames.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))
    starts = sorted(int(i) + 1 for i in np.argsort(change)[-2:])
    assert starts == list(np.cumsum(segments)[:2])
    assert not list(tmp_path.glob(".*partial*")), "no temporary file left"


def test_a_race_tiles_its_lanes_side_by_side_or_shows_one(race, tmp_path):
    plan = plan_montage(race, episodes=8)
    assert [t.label for t in plan.tiles] == ["lane 0 (worker 0)", "lane 1 (worker 1)"]
    out = render_montage(plan, tmp_path / "race.mp4", TINY)
    first = next(iter(iio.imiter(out)))
    assert first.shape == (TINY[0], 2 * TINY[1], 3)
    assert np.abs(first[:, : TINY[1]].astype(int) - first[:, TINY[1] :]).mean() > 1, "two lanes"
    one = plan_montage(race, episodes=8, lane=1)
    assert [t.label for t in one.tiles] == ["lane 1 (worker 1)"]
    assert [ep.worker for ep in one.tiles[0].episodes] == [1, 1]


def test_an_interrupted_montage_leaves_no_file(album, tmp_path):
    plan = plan_montage(album, episodes=2)
    done = []
    with pytest.raises(KeyboardInterrupt):  # `stop` says so after 5 frames, as SIGTERM would
        render_montage(
            plan, tmp_path / "m.mp4", TINY, 30, lambda d, _: done.append(d), lambda: len(done) > 4
        )
    assert list(tmp_path.iterdir()) == []


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(["montage", *args])
    except SystemExit as exit:  # a bad flag: argparse's exit, as launch.py would exit
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def bad_inputs(album: Path, race: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    empty_run = tmp_path / "empty"
    make_album_run(empty_run, lengths=())
    a_file = tmp_path / "file"
    a_file.write_text("")
    (tmp_path / "dir.mp4").mkdir()
    out = ["--out", str(tmp_path / "m.mp4")]
    return {
        "not a run": ([str(tmp_path / "nothing")], "not a multi-worker run directory"),
        "no album": ([str(empty_run)], "no training episodes"),
        "folder missing": ([str(album), "--out", str(tmp_path / "no" / "m.mp4")], "not exist"),
        "folder is a file": ([str(album), "--out", str(a_file / "m.mp4")], "not exist"),
        "a folder": ([str(album), "--out", str(empty_run)], "should end in .mp4"),
        "a folder named .mp4": ([str(album), "--out", str(tmp_path / "dir.mp4")], "a folder"),
        "not mp4": ([str(album), "--out", str(tmp_path / "m.gif")], "should end in .mp4"),
        "no such worker": ([str(album), "--worker", "3", *out], "worker 3 is not in the run"),
        "no race": ([str(album), "--lane", "0", *out], "the run has no race"),
        "no such lane": ([str(race), "--lane", "2", *out], "lane 2 is not in the run's race"),
        "both": ([str(race), "--lane", "0", "--worker", "0", *out], "not both"),
        "no episodes": ([str(album), "--episodes", "0", *out], "1 or more"),
        "bad size": ([str(album), "--size", "64", *out], "WIDTHxHEIGHT"),
    }


def test_bad_input_is_one_line_exit_2_and_nothing_written(album, race, tmp_path, capsys):
    before = {p for p in tmp_path.rglob("*")} | set(album.rglob("*")) | set(race.rglob("*"))
    for name, (args, words) in bad_inputs(album, race, tmp_path).items():
        before |= set(tmp_path.rglob("*"))
        code, out, err = run_cli(args, capsys)
        assert code == 2, name
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, (name, err)
        assert out == ""
        after = set(tmp_path.rglob("*")) | set(album.rglob("*")) | set(race.rglob("*"))
        assert after == before, f"{name}: wrote {after - before}"


def test_a_folder_that_cannot_be_written_is_one_line(album, tmp_path, capsys):
    # A read-only folder stops a user; root writes there, but not into /proc's folders.
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o555)
    if os.geteuid() == 0:
        folder = Path("/proc/self")
    code, _, err = run_cli([str(album), "--out", str(folder / "m.mp4")], capsys)
    assert code == 2 and f"cannot write {folder / 'm.mp4'}" in err
    assert not any(p.name.endswith(".mp4") for p in folder.iterdir()), "nothing half-written"


def test_launch_py_montage_writes_the_file_and_prints_its_path(album, tmp_path):
    out = tmp_path / "m.mp4"
    env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "montage", str(album), "--episodes", "2"]
        + ["--size", "64x48", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert len(frames_of(out)) == segment_frames_of(album, [100, 300])


def segment_frames_of(album: Path, steps: list[int]) -> int:
    plan = plan_montage(album, episodes=len(steps))
    assert [ep.step for ep in plan.tiles[0].episodes] == steps
    return total_frames(plan)


def test_the_window_command_renders_in_the_background_and_says_where(tmp_path):
    run = Run.create(tmp_path / "run", tiny_run(100, episode_length=10), RunSettings(workers=1))
    with pytest.raises(UserError, match="no training episodes"):
        run.do(MakeMontage())  # refused at once: nothing starts
    for n, length in enumerate((3, 6)):
        states, rewards, seconds = episode_poses("cartpole-balance", length, n)
        keep_in_album(run.path, EpisodeReplay(states, rewards, 0, "train", 10 * n + 10, n, seconds))
    (notice,) = run.do(MakeMontage(episodes=3)).notices
    assert notice.startswith("making a montage of 2 album episodes: "), "as many as there are"
    path = Path(notice.rpartition(": ")[2])
    assert path.parent == run.path / "media" and path.suffix == ".mp4"
    # At nice 10 the process is slow on a busy host: a generous deadline, no fixed wait.
    assert run.montages.wait(timeout=300), "the montage process ended"
    lines = run.montages.lines()
    assert lines[-1].startswith("montage written") and lines[-1].endswith(str(path)), lines
    assert path.exists() and list(path.parent.iterdir()) == [path]
    assert len(frames_of(path)) > 0


class _FailingWriter:
    """imageio's writer, failing as imageio or ffmpeg may: `error` raised by the call named
    `at` (after a few frames, for append_data)."""

    def __init__(self, path, error: Exception, at: str):
        self.path, self.error, self.at, self.frames = Path(path), error, at, 0
        if at == "get_writer":
            raise error

    def append_data(self, frame):
        self.frames += 1
        self.path.write_bytes(b"half a video" * self.frames)
        if self.at == "append_data" and self.frames == 3:
            raise self.error

    def close(self):
        if self.at == "close":
            raise self.error


FFMPEG_ERRORS = {
    "no ffmpeg": (RuntimeError("No ffmpeg exe could be found. Install ffmpeg."), "get_writer"),
    "no backend": (ValueError("Could not find a backend to open `m.mp4`"), "get_writer"),
    "ffmpeg ended": (RuntimeError("ffmpeg ended with code 1"), "append_data"),
    "frames refused": (ValueError("All images in a movie should have same size"), "append_data"),
    "ffmpeg's stderr": (OSError("[Errno 32] Broken pipe\n\nFFMPEG COMMAND:\nffmpeg -y"), "close"),
}


@pytest.mark.parametrize("name", FFMPEG_ERRORS)
def test_an_ffmpeg_error_is_one_line_exit_2_and_keeps_what_was_there(
    name, album, tmp_path, capsys, monkeypatch
):
    # Whatever imageio or ffmpeg raises, RuntimeError and ValueError too: one line, exit 2,
    # no half-written file, and a montage already at the target left as it was.
    error, at = FFMPEG_ERRORS[name]
    writer = lambda path, **options: _FailingWriter(path, error, at)  # noqa: E731
    monkeypatch.setattr("workers.showcase.montage.imageio.get_writer", writer)
    out = tmp_path / "m.mp4"
    out.write_bytes(b"an earlier montage")
    code, stdout, err = run_cli([str(album), "--out", str(out), "--size", "64x48"], capsys)
    assert code == 2 and stdout == "", name
    first = str(error).splitlines()[0]
    message = err[err.find("error: ") :]  # after the progress bar, where frames were made
    assert message == f"error: writing {out} failed: {first}\n", name
    assert list(tmp_path.iterdir()) == [out] and out.read_bytes() == b"an earlier montage"
