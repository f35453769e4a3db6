from viewer.pacing import WATCH_TICK_S, FramePacer


def drive(pacer: FramePacer, seconds: float, work_s: float, changed: bool, tick: float = 1 / 32):
    """Run the pacer over `seconds` of loop ticks; returns the times it drew."""
    drawn, t = [], 0.0
    while t < seconds:
        if pacer.due(t, changed):
            pacer.drew(t, work_s)
            drawn.append(t)
        t += tick
    return drawn


def test_watching_keeps_drawing_within_its_cpu_share():
    # software GL: 32 ms a frame, something new every tick, nobody touching the window
    pacer = FramePacer(fps_cap=32, watch_share=0.05)
    drawn = drive(pacer, 60.0, work_s=0.032, changed=True)
    cores = len(drawn) * 0.032 / 60.0
    assert 0.03 < cores <= 0.051  # uses its share, and no more
    assert 1.0 < len(drawn) / 60.0 < 2.0


def test_cheap_frames_are_drawn_at_the_full_rate():
    # a GPU-backed display: 1 ms a frame is under the share even at the cap
    pacer = FramePacer(fps_cap=32, watch_share=0.05)
    drawn = drive(pacer, 10.0, work_s=0.001, changed=True)
    assert len(drawn) / 10.0 > 30


def test_input_draws_at_the_full_rate_for_a_while():
    pacer = FramePacer(fps_cap=32, watch_share=0.05, active_s=1.0)
    drive(pacer, 5.0, work_s=0.032, changed=True)  # learn the frame's cost
    pacer.input(5.0)
    assert all(pacer.due(5.0 + i / 32, changed=False) for i in range(31))
    pacer.drew(5.5, 0.032)
    assert not pacer.due(6.1, changed=False)  # a second after the input: watching again


def test_nothing_new_draws_only_the_idle_frames():
    pacer = FramePacer(fps_cap=32, watch_share=0.05, idle_s=1.0)
    drawn = drive(pacer, 10.0, work_s=0.001, changed=False)
    assert 9 <= len(drawn) <= 11  # one a second, however cheap


def test_the_loop_looks_less_often_while_nobody_uses_the_window():
    pacer = FramePacer(fps_cap=32)
    assert pacer.tick_s(0.0) == WATCH_TICK_S > 1 / 32
    pacer.input(10.0)
    assert pacer.tick_s(10.2) == 1 / 32
