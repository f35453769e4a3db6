import pytest

from agent.config import Config, env_options, field_docs, knobs_of, make_config, with_knobs
from agent.errors import ConfigError
from agent.knobs import knobs


def test_defaults_follow_the_published_method():
    cfg = make_config(5)
    assert cfg.gamma == pytest.approx(0.99)
    assert cfg.resolved_seed_steps == 2500
    # Pretraining: as many updates as seed steps, unless a number is given.
    assert cfg.resolved_pretrain_updates == 2500
    assert make_config(5, seed_steps=300).resolved_pretrain_updates == 300
    assert make_config(5, seed_steps=300, pretrain_updates=7).resolved_pretrain_updates == 7
    assert cfg.resolved_iterations(6) == 6
    assert cfg.resolved_iterations(21) == 8
    # As in the reference, an explicit count is raised by 2 for large action spaces too.
    explicit = make_config(5, iterations=4)
    assert (explicit.resolved_iterations(6), explicit.resolved_iterations(21)) == (4, 6)
    assert (cfg.num_samples, cfg.num_elites, cfg.num_pi_trajs, cfg.horizon) == (512, 64, 24, 3)
    assert (cfg.lr, cfg.enc_lr_scale, cfg.grad_clip_norm, cfg.tau, cfg.rho) == (
        3e-4,
        0.3,
        20,
        0.01,
        0.5,
    )
    assert (cfg.consistency_coef, cfg.reward_coef, cfg.value_coef) == (20, 0.1, 0.1)
    assert cfg.bin_size == pytest.approx(0.2)


@pytest.mark.parametrize(
    "size, dims",
    [
        (1, (256, 384, 128, 2, 2)),
        (5, (256, 512, 512, 2, 5)),
        (19, (1024, 1024, 768, 3, 5)),
        (48, (1792, 1792, 768, 4, 5)),
    ],
)
def test_presets(size, dims):
    cfg = make_config(size)
    assert (cfg.enc_dim, cfg.mlp_dim, cfg.latent_dim, cfg.num_enc_layers, cfg.num_q) == dims


def test_discount_heuristic_is_clipped():
    assert make_config(1, episode_length=10).gamma == pytest.approx(0.95)
    assert make_config(1, episode_length=10_000).gamma == pytest.approx(0.995)
    assert make_config(1, discount=0.9).gamma == pytest.approx(0.9)


def test_every_field_has_a_doc_line():
    docs = field_docs()
    assert set(docs) == {f for f in Config.__dataclass_fields__}
    assert all(docs.values())


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"model_size": 7}, "model_size"),
        ({"steps": 0}, "steps"),
        ({"num_samples": 1}, "num_samples"),
        ({"horizon": 0}, "horizon"),
        ({"temperature": float("nan")}, "temperature"),
        ({"num_pi_trajs": 600}, "num_pi_trajs"),
        ({"batch_size": "x"}, "batch_size"),
        ({"device": "tpu"}, "device"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    overrides = dict(overrides)  # the parameter is shared by every run of the test
    size = overrides.pop("model_size", 5)
    with pytest.raises(ConfigError, match=field) as refused:
        make_config(size, **overrides)
    assert refused.value.field == field  # what a caller keys on, not the message's wording


def test_iterations_0_is_auto_in_a_config_and_never_a_live_value():
    # The range is the knob table's; the table also says 0 means "chosen from the task".
    assert knobs()["iterations"].auto == 0
    assert make_config(1, iterations=0).resolved_iterations(6) == 6
    assert make_config(1, iterations=32).iterations == 32
    for bad in (-1, 33):
        with pytest.raises(ConfigError, match=r"iterations must be in \[1, 32\]") as refused:
            make_config(1, iterations=bad)
        assert refused.value.field == "iterations"
    with pytest.raises(ConfigError, match=r"iterations must be in \[1, 32\], got 0"):
        with_knobs(make_config(1), iterations=0)  # as a live knob, 0 is refused


def test_knobs_validated_and_unchanged_on_error():
    cfg = make_config(1)
    changed = with_knobs(cfg, horizon=5, iterations=2, temperature=1.5)
    assert (changed.horizon, changed.iterations, changed.temperature) == (5, 2, 1.5)
    with pytest.raises(ConfigError, match=r"horizon must be in \[1, 16\]"):
        with_knobs(cfg, horizon=99)
    with pytest.raises(ConfigError, match="not a live knob"):
        with_knobs(cfg, latent_dim=3)
    with pytest.raises(ConfigError, match="whole number"):
        with_knobs(cfg, iterations=2.5)
    with pytest.raises(ConfigError, match="num_elites"):
        with_knobs(cfg, num_samples=32, num_elites=64)
    assert cfg.horizon == 3 and set(knobs("agent")) >= {"horizon", "iterations", "num_samples"}


def test_config_built_directly_takes_its_model_size_preset():
    # Config(model_size=1) is the 1M model (not the 5M dimensions of the field defaults); an
    # architecture value given explicitly still wins.
    one = Config(model_size=1)
    dims = (one.enc_dim, one.mlp_dim, one.latent_dim, one.num_enc_layers, one.num_q)
    assert dims == (256, 384, 128, 2, 2)
    assert Config(model_size=19).mlp_dim == 1024
    assert Config(model_size=1, mlp_dim=96).mlp_dim == 96
    assert Config(model_size=1) == make_config(1)
    with pytest.raises(ConfigError, match="model_size"):
        Config(model_size=7)


def test_a_config_as_a_dict_and_the_agents_knobs_alone():
    from agent.config import to_dict

    cfg = make_config(1, horizon=4)
    assert to_dict(cfg)["horizon"] == 4 and to_dict(cfg)["mlp_dim"] == 384
    worker_knobs = set(knobs()) - set(knobs("agent"))
    assert worker_knobs, "the table has knobs of the workers' layer too"
    with pytest.raises(ConfigError, match="not a live knob"):
        with_knobs(cfg, **{name: 1 for name in worker_knobs})


def test_large_action_spaces_plan_two_more_iterations():
    cfg = make_config(1)
    assert [cfg.resolved_iterations(d) for d in (19, 20, 21)] == [6, 8, 8]
    assert with_knobs(cfg, iterations=3).resolved_iterations(20) == 5


def test_the_bounds_of_every_range_are_where_they_say():
    assert make_config(1, horizon=16).horizon == 16  # a range's upper end is allowed
    assert make_config(1, num_samples=64, num_elites=64).num_elites == 64
    assert make_config(1, min_std=0.5, max_std=0.5).min_std == 0.5
    for device in ("cuda", "cuda:0"):
        assert make_config(1, device=device).device == device  # checked when the agent starts
    for bad, field in (
        ({"num_samples": 64, "num_pi_trajs": 64}, "num_pi_trajs"),
        ({"vmin": 3.0, "vmax": 3.0}, "vmin"),
    ):
        with pytest.raises(ConfigError, match=field):
            make_config(1, **bad)
    for build in (lambda: make_config(7), lambda: Config(model_size=7)):
        with pytest.raises(ConfigError, match="one of 1, 5, 19, 48, 317, got 7"):
            build()


def test_the_default_model_is_the_5m_preset():
    assert make_config() == Config()
    assert (make_config().model_size, make_config().latent_dim) == (5, 512)


def test_env_kwargs_are_a_json_object_given_to_a_gymnasium_env():
    assert make_config(1).env_options == {}
    cfg = make_config(1, task="Hopper-v5", env_kwargs='{"frame_skip": 2, "x": [1]}')
    assert cfg.env_options == {"frame_skip": 2, "x": [1]}
    for bad in ("[1, 2]", "{not json", '"text"', "3"):
        with pytest.raises(ConfigError, match="env_kwargs must be a JSON object") as refused:
            make_config(1, env_kwargs=bad)
        assert refused.value.field == "env_kwargs"
        assert env_options(bad) == {}  # what the env is built with, never a list or a number


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: make_config(1, num_samples=64, num_pi_trajs=64), "num_pi_trajs"),
        (lambda: make_config(1, num_samples=64, num_elites=65), "num_elites"),
        (lambda: make_config(1, min_std=0.6, max_std=0.5), "min_std"),
        (lambda: make_config(1, latent_dim=36, simnorm_dim=8), "latent_dim"),
        (lambda: make_config(1, vmin=3.0, vmax=3.0), "vmin"),
        (lambda: make_config(1, device="tpu"), "device"),
        (lambda: make_config(7), "model_size"),
        (lambda: Config(model_size=7), "model_size"),
        (lambda: make_config(1, batch_size="x"), "batch_size"),
        (lambda: make_config(1, bogus=1), "bogus"),
        (lambda: make_config(1, bogus=1, other=2), None),  # two unknown names: no one field
    ],
)
def test_every_error_carries_the_field_it_is_about(build, field):
    with pytest.raises(ConfigError) as refused:
        build()
    assert refused.value.field == field


def test_a_configs_knobs_are_the_agent_layers_of_the_table():
    cfg = make_config(1, horizon=4)
    assert set(knob_values := knobs_of(cfg)) == set(knobs("agent")) and knob_values["horizon"] == 4


def test_the_fast_path_is_auto_or_one_chosen_by_hand():
    assert make_config(1).fast_path == "auto"
    for path in ("auto", "graphs", "compile", "eager"):
        assert make_config(1, fast_path=path).fast_path == path
    assert make_config(1, fast_path="eager", compile=False).compile is False
    assert make_config(1, fast_path="auto", compile=False).fast_path == "auto"
    with pytest.raises(ConfigError) as refused:
        make_config(1, fast_path="fast")
    assert str(refused.value) == "fast_path must be auto, graphs, compile or eager, got 'fast'"
    assert refused.value.field == "fast_path"
    for path in ("graphs", "compile"):
        with pytest.raises(ConfigError) as refused:
            make_config(1, fast_path=path, compile=False)
        assert str(refused.value) == f"fast_path {path} compiles: it cannot go with compile off"
        assert refused.value.field == "fast_path"
