"""Screenshots and clips of the viewport, written off the GUI thread, in the run's media/ folder."""

from pathlib import Path

import imageio.v3 as iio
import numpy as np

from viewer.recorder import ClipRecorder, media_dir, save_screenshot

ROOT = Path(__file__).resolve().parents[2]


def frames(count: int) -> list[np.ndarray]:
    out = []
    for i in range(count):
        frame = np.zeros((300, 400, 3), np.uint8)
        frame[:, i * 10 : (i + 1) * 10] = 255  # a bar that moves
        out.append(frame)
    return out


def test_clip_holds_every_frame_added(tmp_path):
    recorder = ClipRecorder(tmp_path / "media", fps=30)
    for frame in frames(24):
        recorder.add(frame)
    path = recorder.stop()
    assert recorder.error is None and recorder.frames_written == 24
    assert path.suffix == ".mp4" and path.parent == tmp_path / "media"
    clip = iio.imread(path, index=None)
    assert clip.shape == (24, 300, 400, 3)
    # the moving bar is where it was drawn (lossy codec: compare brightness, not bytes)
    assert clip[5][:, 50:60].mean() > 200 and clip[5][:, 200:210].mean() < 50


def test_screenshots_never_overwrite_each_other(tmp_path):
    first = save_screenshot(frames(1)[0], tmp_path)
    second = save_screenshot(frames(2)[1], tmp_path)
    assert first != second and first.exists() and second.exists()
    assert np.array_equal(iio.imread(second), frames(2)[1])


def test_a_clip_that_cannot_be_written_reports_instead_of_raising(tmp_path):
    recorder = ClipRecorder(tmp_path, fps=30)
    recorder.add(np.zeros((300, 400), np.float64))  # not an image the encoder takes
    recorder.add(frames(1)[0])
    recorder.stop(timeout=30)
    assert recorder.error is not None


def test_pictures_go_to_the_runs_media_folder_and_with_no_run_where_git_ignores_them():
    assert media_dir("runs/walker-walk-1") == Path("runs/walker-walk-1/media")
    nowhere = media_dir(None)
    assert not nowhere.is_absolute()  # beside the runs, from where the window was started
    ignored = (ROOT / ".gitignore").read_text().split()
    assert f"{nowhere.parts[0]}/" in ignored, nowhere
