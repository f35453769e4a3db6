"""The window end to end under Xvfb, driven with real X input (xdotool): start launch.py on a tiny
preset, let it train, type a new planning horizon into its slider, check that every worker
applied it, take screenshots (Ctrl+P and the whole screen; the viewport replaying an episode),
quit with Ctrl+Q, check the checkpoints."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
from helpers.views import LIKE, task_view, unlike

from viewer.theme import ACCENT

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--task", "cartpole-balance", "--model-size", "1", "--device", "cpu", "--workers", "2",
    "--merge-every", "100", "--seed-steps", "100", "--episode-length", "50",
    "--mlp-dim", "32", "--enc-dim", "16", "--latent-dim", "16", "--batch-size", "16",
    "--num-samples", "16", "--num-elites", "4", "--num-pi-trajs", "2", "--iterations", "1",
    "--eval-every", "0",
]  # fmt: skip


def start_xvfb() -> tuple[subprocess.Popen, str]:
    """An X server on a free display number (Xvfb picks it and writes it to a pipe)."""
    read, write = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
        pass_fds=(write,),
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    with os.fdopen(read) as pipe:
        number = pipe.readline().strip()
    return server, f":{number}"


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def grab_shown(x, display: str, png: Path, rect: list[int]) -> bool:
    """Whether the slider at `rect` on the screen shows its grab (the theme's accent colour):
    ImGui draws none while a Ctrl+click has made the slider a text entry."""
    left, top, width, height = rect
    x("import", "-display", display, "-window", "root", str(png))
    pixels = iio.imread(png)[top : top + height, left : left + width, :3].astype(int)
    return int(np.all(np.abs(pixels - np.array(ACCENT)) < 30, axis=-1).sum()) > 20


def records(run: Path, kind: str, worker: int) -> list[dict]:
    path = run / f"worker-{worker}.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if r["kind"] == kind]


def window_env(display: str, ui_map: Path, **more: str) -> dict:
    """The environment of launch.py and of the X tools: the display, and the UI map's file."""
    return {
        **os.environ,
        "DISPLAY": display,
        "TDMPC2_LIVE_NO_BOOTSTRAP": "1",
        "OMP_NUM_THREADS": "1",
        "TDMPC2_LIVE_UI_MAP": str(ui_map),
        **more,
    }


def x_tool(env: dict):
    """Runs an X tool (xdotool, import) on the test's display; returns its output."""

    def x(*args: str) -> str:
        return subprocess.run(
            args, env=env, check=True, capture_output=True, text=True, timeout=120
        ).stdout

    return x


def quit_with_ctrl_q(x, window: str, app: subprocess.Popen) -> None:
    """Ctrl+Q closes the window; the program exits 0 once its workers have stopped.

    Pressed as a person does, Ctrl held down for longer than the idle window takes to draw its
    next frame (keys are read only when a frame is drawn: `xdotool key ctrl+q` releases Ctrl
    within a millisecond, and on a loaded machine the frame that reads Q can come after
    that). Pressed again every 30 s, as a person would, should the window not have closed."""
    press = ["keydown", "--window", window, "ctrl", "sleep", "1.5", "key", "--window", window]
    press += ["q", "sleep", "1.5", "keyup", "--window", window, "ctrl"]
    for _ in range(6):
        try:
            x("xdotool", *press)
        except subprocess.CalledProcessError:
            pass  # the window is gone already: the program is stopping
        try:
            code = app.wait(30)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        app.kill()
        raise AssertionError(f"no exit 180 s after Ctrl+Q: {app.stderr.read()[-3000:]}")
    assert code == 0, app.stderr.read()


def ctrl_p(x, window: str, run: Path):
    """A check that presses Ctrl+P and returns the frames it saved within 3 s (none: to be
    pressed again; until the showcase's first frame arrives, Ctrl+P is refused)."""

    def saved() -> list[Path]:
        x("xdotool", "key", "--window", window, "ctrl+p")
        deadline = time.monotonic() + 3.0
        while not (shots := list((run / "media").glob("screenshot-*.png"))):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return shots

    return saved


OVERLAY_ROWS = 70  # the viewport's top rows: the overlay's text on a darkened band


def viewport_of(screen_png: Path, rect: list[int]) -> np.ndarray:
    """The viewport's pixels on a screenshot of the whole screen, less the overlay's rows."""
    left, top, width, height = rect
    return iio.imread(screen_png)[top + OVERLAY_ROWS : top + height, left : left + width, :3]


def end_all(app: subprocess.Popen, server: subprocess.Popen) -> None:
    """Whatever happened: the program and the X server end with the test."""
    if app.poll() is None:
        app.kill()
    server.terminate()


def test_window_trains_applies_a_slider_screenshots_and_checkpoints_on_close(tmp_path):
    """launch.py's window under Xvfb, driven with real X input: training, a slider typed into,
    Ctrl+P and screen grabs showing cartpole, the overlay and motion of a replay, Ctrl+Q and
    checkpoints. Only the real window shows what reaches the screen and what real keys do."""
    run = tmp_path / "run"
    ui_map, stats = tmp_path / "ui.json", tmp_path / "stats.json"
    server, display = start_xvfb()
    env = window_env(display, ui_map, TDMPC2_LIVE_STATS=str(stats))
    x = x_tool(env)

    app = subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "launch.py"), *TINY),
            *("--run-dir", str(run), "--viewport", "replay"),
        ],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rects = json.loads(wait_for(lambda: ui_map.exists() and ui_map.read_text(), 120, "UI"))
        window = wait_for(lambda: x("xdotool", "search", "--name", "TD-MPC2 Live"), 30, "window")
        window = window.split()[0]
        # training: both workers finished episodes and merged
        wait_for(
            lambda: all(records(run, "merge", w) and records(run, "episode", w) for w in (0, 1)),
            240,
            "both workers to train and merge",
        )

        # Ctrl+click the horizon slider (ImGui's text entry), type 5, Enter: real X input.
        slider = rects["knob_horizon"]
        left, top, width, height = slider
        assert grab_shown(x, display, tmp_path / "slider.png", slider)  # the measure
        x(
            "xdotool",
            "mousemove",
            "--window",
            window,
            str(left + width // 2),
            str(top + height // 2),
        )
        x("xdotool", "keydown", "ctrl", "click", "1", "keyup", "ctrl")
        # Typed into once it is a text entry: drawn without the slider's grab.
        wait_for(
            lambda: not grab_shown(x, display, tmp_path / "slider.png", slider),
            30,
            "the slider to turn into a text entry",
            poll=0.05,
        )
        x("xdotool", "key", "ctrl+a")
        x("xdotool", "type", "5")
        x("xdotool", "key", "Return")

        def applied(worker: int) -> bool:
            return any(r["values"]["horizon"] == 5 for r in records(run, "knobs_applied", worker))

        wait_for(lambda: applied(0) and applied(1), 60, "both workers to apply horizon 5")
        history = [json.loads(line) for line in (run / "knobs.jsonl").read_text().splitlines()]
        assert history[-1]["changes"] == {"horizon": 5}

        # Ctrl+P saves the viewport's frame; the screen shows the viewport and a chart with data.
        # (Until the showcase's first frame arrives, Ctrl+P is refused: press it again.)
        x("xdotool", "mousemove", "--window", window, "5", "5")

        shot = wait_for(ctrl_p(x, window, run), 120, "a frame saved with Ctrl+P", poll=0)
        # The frame saved and the viewport on screen show this run's task, cartpole: not a
        # blank or uniform frame, not another task's scene.
        frame = iio.imread(shot[0])
        assert frame.shape == (300, 400, 3)
        cartpole = task_view("cartpole-balance", 300, 400)
        assert unlike(task_view("acrobot-swingup", 300, 400), cartpole) > LIKE  # the measure
        assert unlike(frame, cartpole) < LIKE, unlike(frame, cartpole)
        screen_png = tmp_path / "screen.png"
        x("import", "-display", display, "-window", "root", str(screen_png))
        screen = iio.imread(screen_png)[..., :3].astype(int)
        viewport = viewport_of(screen_png, rects["viewport_draw"])
        _, _, width, height = rects["viewport_draw"]
        on_screen = task_view("cartpole-balance", height, width)[OVERLAY_ROWS:]
        assert unlike(viewport, on_screen) < LIKE, unlike(viewport, on_screen)
        left, top, width, height = rects["plot_returns"]
        chart = screen[top : top + height, left : left + width]
        worker_0_blue = np.all(np.abs(chart - np.array([86, 156, 214])) < 30, axis=-1)
        assert worker_0_blue.sum() > 50, "no data line of worker 0 in the returns chart"

        # --viewport replay: the newest finished episode again at 1x. The overlay says so, and
        # screenshots show it moving (an episode here lasts 1 s, then 1 s held).
        def overlay() -> list[str]:
            return json.loads(ui_map.read_text())["texts"]["overlay"]

        wait_for(lambda: overlay()[0].startswith("REPLAY 1.0x"), 60, "the overlay to say replay")
        left, top, width, height = rects["viewport_draw"]

        def view() -> np.ndarray:
            x("import", "-display", display, "-window", "root", str(screen_png))
            assert overlay()[0].startswith("REPLAY 1.0x"), overlay()
            return iio.imread(screen_png)[top : top + height, left : left + width, :3]

        first = view()
        wait_for(lambda: not np.array_equal(view(), first), 10, "motion in the replay", poll=0)

        # A click at the timeline's left end pins the album's first episode: it loops.
        rects = json.loads(ui_map.read_text())
        left, top, width, height = rects["timeline"]
        x("xdotool", "mousemove", "--window", window, str(left + 3), str(top + height // 2))
        x("xdotool", "click", "1")
        wait_for(lambda: overlay()[0].startswith("PINNED"), 60, "the overlay to say pinned")
        assert "step 50" in overlay()[0], overlay()  # the first episode ends at agent step 50

        # Ctrl+Q closes the window; the workers stop and write their checkpoints.
        before_close = time.time()
        quit_with_ctrl_q(x, window, app)
    finally:
        end_all(app, server)
    for w in (0, 1):
        checkpoint = run / "checkpoints" / f"worker-{w}.pt"
        assert checkpoint.exists() and checkpoint.stat().st_mtime >= before_close
        assert records(run, "checkpoint", w)[-1]["time"] >= before_close - 1
    assert json.loads(stats.read_text())["frames"] > 0


def test_window_shows_a_race_of_two_lanes_and_promotes_one(tmp_path):
    """The window under Xvfb shows a race of two lanes in its table and its viewport playing the
    task; a real click on Promote ends the race and reaches the control worker. Only the real
    window shows the table drawn and the click routed."""
    run = tmp_path / "run"
    ui_map = tmp_path / "ui.json"
    server, display = start_xvfb()
    env = window_env(display, ui_map)
    x = x_tool(env)

    # A merging lane against one that never merges: the original merging experiment, small.
    lanes = ["--lane=workers=1,iterations=2", "--lane=workers=1,merge=off", "--merge-every=30"]
    app = subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), *TINY, *lanes, "--run-dir", str(run)],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )

    def race_rows() -> list[list[str]]:
        try:
            return json.loads(ui_map.read_text())["texts"]["race"]
        except (OSError, ValueError, KeyError):
            return []

    def both_lanes_ranked():
        rows = race_rows()
        # columns: leader, lane, knobs, workers, steps, steps/s, return, eval, score, thresholds
        lanes = {row[1]: row for row in rows}
        ready = set(lanes) == {"0", "1"} and all(
            row[6] != "-" and row[8] != "-" and int(row[4].replace(",", "")) > 30 for row in rows
        )
        return lanes if ready else None

    try:
        lanes_shown = wait_for(both_lanes_ranked, 300, "the race table to rank both lanes")
        assert lanes_shown["0"][2] == "iterations=2", lanes_shown
        assert lanes_shown["1"][2] == "iterations=1,merge=off"
        assert [row[3] for row in lanes_shown.values()] == ["1", "1"]
        assert sum(row[0] == "leads" for row in lanes_shown.values()) <= 1
        assert all(" +- " in row[8] for row in lanes_shown.values())  # a score and its spread
        # The viewport on screen shows the race's task (cartpole) played live. The player
        # runs at nice 19: on a loaded machine its first frame can take minutes.
        screen_png = tmp_path / "race.png"
        rect = json.loads(ui_map.read_text())["viewport_draw"]
        on_screen = task_view("cartpole-balance", rect[3], rect[2])[OVERLAY_ROWS:]
        shown: list[float] = []

        def viewport_shows_cartpole() -> bool:
            x("import", "-display", display, "-window", "root", str(screen_png))
            shown.append(unlike(viewport_of(screen_png, rect), on_screen))
            return shown[-1] < LIKE

        try:
            wait_for(viewport_shows_cartpole, 300, "the viewport to show cartpole")
        except AssertionError as error:
            overlay = json.loads(ui_map.read_text())["texts"]["overlay"]  # empty: no frame yet
            raise AssertionError(f"{error}; unlike it by {shown[-5:]}; overlay {overlay}") from None

        # Promote lane 0 (chosen by default) with a real click.
        window = x("xdotool", "search", "--name", "TD-MPC2 Live").split()[0]
        left, top, width, height = json.loads(ui_map.read_text())["promote"]
        x("xdotool", "mousemove", "--window", window, str(left + width // 2), str(top + 8))
        x("xdotool", "click", "1")

        def promoted() -> bool:
            history = [json.loads(line) for line in (run / "knobs.jsonl").read_text().splitlines()]
            return history[-1]["event"] == "promote" and history[-1]["lane"] == 0

        wait_for(promoted, 60, "lane 0 promoted")
        wait_for(lambda: not race_rows(), 60, "the race table to go once the race ended")

        def applied_by_the_control() -> dict | None:
            applied = records(run, "knobs_applied", 1)
            return applied[-1] if applied and applied[-1].get("lane") is None else None

        applied = wait_for(applied_by_the_control, 120, "worker 1 to apply the promotion")
        quit_with_ctrl_q(x, window, app)
    finally:
        end_all(app, server)
    assert applied["values"]["iterations"] == 2  # lane 0's values, for the control worker too


def test_window_of_a_run_from_pixels_shows_the_agents_frames_beside_the_view(tmp_path):
    """A run from pixels (issue 55) opens on the agent's view: Ctrl+P's frame has the task at
    its left and, in its column, the 64x64 frames the agent is given (cartpole from camera 0),
    not a blank or another view. Only the real window shows what reaches its viewport."""
    from workers.door import agent_view_boxes

    run, ui_map = tmp_path / "run", tmp_path / "ui.json"
    server, display = start_xvfb()
    env = window_env(display, ui_map)
    x = x_tool(env)
    one = [*TINY[: TINY.index("--workers")], *TINY[TINY.index("--workers") + 2 :]]
    app = subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), *one, "--workers", "1", "--obs", "rgb"]
        + ["--run-dir", str(run), "--viewport", "live"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: ui_map.exists() and ui_map.read_text(), 120, "UI")
        window = wait_for(lambda: x("xdotool", "search", "--name", "TD-MPC2 Live"), 30, "window")
        window = window.split()[0]
        x("xdotool", "mousemove", "--window", window, "5", "5")

        frame = iio.imread(wait_for(ctrl_p(x, window, run), 180, "a frame", poll=0)[0])[..., :3]
        assert frame.shape == (300, 400, 3)
        seen = task_view("cartpole-balance", 64, 64, rendered=(64, 64))
        for top, left, side in agent_view_boxes(300, 400):
            shown = frame[top : top + side, left : left + side]
            reference = seen[np.arange(side) * 64 // side][:, np.arange(side) * 64 // side]
            assert unlike(shown, reference) < LIKE, unlike(shown, reference)
        view = frame[OVERLAY_ROWS:, : agent_view_boxes(300, 400)[0][1] - 4]
        size = (300, view.shape[1])
        wide = task_view("cartpole-balance", *size, rendered=size)[OVERLAY_ROWS:]
        other = task_view("acrobot-swingup", *size, rendered=size)[OVERLAY_ROWS:]
        assert unlike(other, wide) > LIKE  # the measure
        assert unlike(view, wide) < LIKE, unlike(view, wide)
        quit_with_ctrl_q(x, window, app)
    finally:
        end_all(app, server)
