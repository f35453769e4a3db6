"""`launch.py bench --obs rgb` and `python -m bench.pixels` (issue 55): what a step from pixels
costs, the rendering included, beside what it costs from states."""

import json

from e2e.test_bench_pack import TINY

from bench import pixels as bench_pixels
from bench.cli import main


def test_bench_from_pixels_times_the_frames_update_and_rendering(capsys):
    argv = ["bench", "--repeats", "2", "--warmup", "1", "--threads", "1", "--json"]
    assert main([*argv, *TINY, "--obs", "rgb"]) == 0
    pixels = json.loads(capsys.readouterr().out)
    assert main([*argv, *TINY]) == 0
    states = json.loads(capsys.readouterr().out)
    assert pixels["obs"] == "rgb" and pixels["gl"] in ("egl", "osmesa")
    assert states["obs"] == "state" and states["gl"] is None
    # the env step renders a frame; the update runs the convolutions on 4 x 32 stacked frames
    assert pixels["env_step_ms"] > 3 * states["env_step_ms"]
    assert pixels["update_gflop"] > 2 * states["update_gflop"]
    assert "ratio_to_reference" not in pixels  # the reference figures are from states


def test_a_frames_render_cost_is_measured_per_backend():
    cost = bench_pixels.render_costs("cartpole-balance", 5)
    assert cost["frame_ms"] > 0 and cost["rgb_step_ms"] > cost["state_step_ms"]
    assert cost["render_ms_per_step"] == round(cost["rgb_step_ms"] - cost["state_step_ms"], 3)
    failed = bench_pixels.render_line("no-such-backend", "cartpole-balance", 5)
    assert failed["gl"] == "no-such-backend" and failed["error"]
