"""One typed config for TD-MPC2: defaults of the 5M single-task model, presets, live knobs.
Over 300 lines because every field is declared here with its one-line doc and its range."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
from dataclasses import dataclass, fields, replace
from functools import cache

from agent.errors import ConfigError
from agent.knobs import knobs


@dataclass(frozen=True)
class Config:
    # environment
    task: str = "walker-walk"
    """DMControl task as domain-task (walker-walk), or a gymnasium id (Hopper-v5, pkg:Env-v0)."""
    obs: str = "state"
    """What the agent sees: state (the task's state vector) or rgb (the last 3 frames of a 64x64
    camera, DMControl tasks only), as the authors' `obs`."""
    env_kwargs: str = ""
    """A gymnasium env's constructor arguments as a JSON object, e.g. {"frame_skip": 2}."""
    seed: int = 1
    """Seed for networks, sampling and the environments."""
    episode_length: int = 500
    """Agent steps per episode (1000 control steps at action repeat 2)."""
    action_repeat: int = 2
    """Physics control steps per agent step; rewards are summed."""
    num_envs: int = 1
    """Environments stepped together by one agent."""
    steps_per_update: int = 1
    """Environment steps (summed over envs) per gradient update after seeding."""
    updates_per_step: int = 1
    """Gradient updates per `steps_per_update` environment steps: with it, the update-to-data
    ratio (N updates per step spends the compute of N merged workers on one worker's data)."""
    episodic: bool = False
    """Handle terminations: a termination head, nothing bootstrapped past a terminal state.
    Off: a termination is bootstrapped through like a time limit (on by default for a
    gymnasium task that can terminate)."""

    # training
    steps: int = 100_000
    """Total agent steps to train for (summed over envs)."""
    batch_size: int = 256
    """Slices of horizon+1 per gradient update."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (capped at the number of training steps)."""
    seed_steps: int = 0
    """Random-action steps before learning; 0 means max(1000, 5 x episode_length)."""
    pretrain_updates: int = 0
    """Updates on the seed data before acting; 0 means as many as seed steps (the authors')."""
    lr: float = 3e-4
    """Adam learning rate."""
    enc_lr_scale: float = 0.3
    """Encoder learning rate as a fraction of lr."""
    grad_clip_norm: float = 20.0
    """Gradient-norm clip for the model and the policy."""
    consistency_coef: float = 20.0
    """Weight of the latent consistency loss."""
    reward_coef: float = 0.1
    """Weight of the reward loss."""
    value_coef: float = 0.1
    """Weight of the value loss."""
    termination_coef: float = 1.0
    """Weight of the termination loss (episodic only)."""
    rho: float = 0.5
    """Temporal weight: the loss at step t is weighted rho**t."""
    tau: float = 0.01
    """Polyak rate for target Qs and the running Q scale."""
    entropy_coef: float = 1e-4
    """Policy entropy coefficient (multiplied by the action dimension)."""
    discount: float = 0.0
    """Discount; 0 means the heuristic clip((L/5-1)/(L/5), 0.95, 0.995) from episode length L."""

    # planning (the live knobs among them: agent/knobs.py)
    horizon: int = 3
    """Latent rollout length for learning, and the planning horizon at start."""
    iterations: int = 0
    """MPPI iterations; 0 means 6. As in the reference, 2 more run when action_dim >= 20."""
    num_samples: int = 512
    """MPPI action sequences per iteration (policy trajectories included)."""
    num_elites: int = 64
    """Best sequences kept each MPPI iteration."""
    num_pi_trajs: int = 24
    """Sequences rolled out by the policy prior."""
    temperature: float = 0.5
    """MPPI softmax temperature on elite values."""
    min_std: float = 0.05
    """Lower clamp of the MPPI sampling std."""
    max_std: float = 2.0
    """Upper clamp (and start value) of the MPPI sampling std."""
    mpc: bool = True
    """Act by planning; False acts with the policy prior alone."""

    # architecture (0: the model_size preset's value)
    model_size: int = 5
    """Preset: 1, 5, 19, 48 or 317 (million parameters)."""
    enc_dim: int = 0
    """Encoder hidden width (0: from model_size)."""
    mlp_dim: int = 0
    """Hidden width of dynamics, reward, policy and Q networks (0: from model_size)."""
    latent_dim: int = 0
    """Latent state size, a multiple of simnorm_dim (0: from model_size)."""
    num_enc_layers: int = 0
    """Encoder layers, hidden layers plus the output layer (0: from model_size)."""
    num_q: int = 0
    """Q functions in the ensemble (0: from model_size)."""
    num_channels: int = 32
    """Channels of each convolution of the pixel encoder (--obs rgb)."""
    dropout: float = 0.01
    """Dropout on the first layer of each Q network."""
    simnorm_dim: int = 8
    """SimNorm group size."""
    num_bins: int = 101
    """Bins of the two-hot reward and value distributions."""
    vmin: float = -10.0
    """Lower end of the two-hot support (symlog space)."""
    vmax: float = 10.0
    """Upper end of the two-hot support (symlog space)."""
    log_std_min: float = -10.0
    """Lowest policy log std."""
    log_std_max: float = 2.0
    """Highest policy log std."""

    # evaluation, logging, speed
    eval_every: int = 50_000
    """Agent steps between evaluations (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation (deterministic actions)."""
    device: str = "auto"
    """cpu, cuda or auto (CUDA when available)."""
    compile: bool = True
    """torch.compile update and plan with CUDA graphs (used on CUDA only)."""
    fast_path: str = "auto"
    """auto, graphs, compile or eager: auto checks the fastest at start-up against the plain
    path (eager, float32, one agent per worker) and falls back until one agrees; the others
    choose by hand (graphs and compile: CUDA only)."""
    bf16: bool = False
    """bf16 numbers on a CPU (runs from the command line or the window: on where the CPU has a
    bf16 unit; without one, matmuls in float32 on the same numbers, no faster)."""

    # the merge rule: what a worker takes from its pool's mean (agent/pack/merge_rule.py)
    merge_pull: float = 1.0
    """How far each worker moves towards the merged weights (1: all the way, the plain mean)."""
    outer_lr: float = 1.0
    """Outer step from the pool's last merged weights along the mean's change (1: the mean)."""
    outer_momentum: float = 0.0
    """Nesterov momentum of the outer step, kept by the pool (0: none)."""
    merge_policy: bool = True
    """Whether the policy prior is merged (off: each worker keeps its own)."""

    def __post_init__(self) -> None:
        # Architecture fields left at 0 take the model_size preset, so Config(model_size=1)
        # is the 1M model; a value given explicitly wins.
        if self.model_size in MODEL_SIZES:
            for name, value in zip(ARCHITECTURE_FIELDS, MODEL_SIZES[self.model_size]):
                if getattr(self, name) == 0:
                    object.__setattr__(self, name, value)
        validate(self)

    # derived values -------------------------------------------------------------
    @property
    def gamma(self) -> float:
        if self.discount > 0:
            return self.discount
        frac = self.episode_length / 5
        return min(max((frac - 1) / frac, 0.95), 0.995)

    @property
    def env_options(self) -> dict:
        """env_kwargs as a dict (validated: a JSON object)."""
        return env_options(self.env_kwargs)

    @property
    def resolved_seed_steps(self) -> int:
        return self.seed_steps or max(1000, 5 * self.episode_length)

    @property
    def resolved_pretrain_updates(self) -> int:
        return self.pretrain_updates or self.resolved_seed_steps

    def resolved_iterations(self, action_dim: int) -> int:
        """Iterations the planner runs: the reference adds 2 for large action spaces to any
        value, an explicit one included."""
        return (self.iterations or 6) + (2 if action_dim >= 20 else 0)

    @property
    def bin_size(self) -> float:
        return (self.vmax - self.vmin) / (self.num_bins - 1)


ARCHITECTURE_FIELDS = ("enc_dim", "mlp_dim", "latent_dim", "num_enc_layers", "num_q")
# name: the ARCHITECTURE_FIELDS values
MODEL_SIZES: dict[int, tuple[int, int, int, int, int]] = {
    1: (256, 384, 128, 2, 2),
    5: (256, 512, 512, 2, 5),
    19: (1024, 1024, 768, 3, 5),
    48: (1792, 1792, 768, 4, 5),
    317: (4096, 4096, 1376, 5, 8),
}

# fast_path's values: the start-up self-check chooses (auto), or one by hand (agent/self_check.py).
FAST_PATHS = ("auto", "graphs", "compile", "eager")

# Other fields with numeric bounds: name -> (low, high), inclusive.
FIELD_RANGES: dict[str, tuple[float, float]] = {
    "episode_length": (1, 100_000),
    "action_repeat": (1, 100),
    "num_envs": (1, 256),
    "steps": (1, 10**10),
    "batch_size": (1, 65_536),
    "buffer_size": (1, 10**9),
    "seed_steps": (0, 10**9),
    "pretrain_updates": (0, 10**9),
    "lr": (1e-8, 1.0),
    "enc_lr_scale": (0.0, 10.0),
    "grad_clip_norm": (1e-6, 1e6),
    "rho": (0.0, 1.0),
    "tau": (0.0, 1.0),
    "entropy_coef": (0.0, 10.0),
    "discount": (0.0, 1.0),
    "min_std": (1e-6, 10.0),
    "max_std": (1e-6, 10.0),
    "num_q": (2, 64),
    "dropout": (0.0, 0.99),
    "num_bins": (3, 1001),
    "eval_every": (0, 10**10),
    "eval_episodes": (1, 1000),
    "enc_dim": (1, 65_536),
    "mlp_dim": (1, 65_536),
    "latent_dim": (1, 65_536),
    "num_enc_layers": (1, 64),
    "simnorm_dim": (1, 1024),
    "num_channels": (1, 1024),
}

# obs's values: the state vector, or stacked camera frames (agent/pixels.py).
OBS_KINDS = ("state", "rgb")


def _json_object(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def env_options(env_kwargs: str) -> dict:
    """A gymnasium env's constructor arguments from their JSON text; {} when there are none or
    the text is not a JSON object (validate() refuses that with its own message)."""
    parsed = _json_object(env_kwargs) if env_kwargs else {}
    return parsed if isinstance(parsed, dict) else {}


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value}", name)
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low:g}, {high:g}], got {value}", name)


# What a config may ask a machine to hold: about 3x the largest preset. A config read from a run
# directory someone else made must not make the window's player allocate hundreds of GB.
MAX_WEIGHTS = 1_000_000_000


def _weights_bound(cfg: Config) -> int:
    """More than the model's weights, roughly: every layer as wide as the widest."""
    widest = max(cfg.enc_dim, cfg.mlp_dim, cfg.latent_dim)
    return widest * widest * (cfg.num_enc_layers + 2 * cfg.num_q + 8)


def validate(cfg: Config) -> None:
    """Raise ConfigError naming the first field that is out of its range."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        expected = {"int": int, "float": (int, float), "bool": bool, "str": str}[f.type]
        if isinstance(value, bool) and f.type != "bool" or not isinstance(value, expected):
            raise ConfigError(f"{f.name} must be of type {f.type}, got {value!r}", f.name)
    if cfg.model_size not in MODEL_SIZES:
        sizes = ", ".join(str(s) for s in MODEL_SIZES)
        raise ConfigError(f"model_size must be one of {sizes}, got {cfg.model_size}", "model_size")
    if not cfg.task.isprintable() or len(cfg.task) > 200:
        raise ConfigError("task must be a name of at most 200 printable characters", "task")
    for name, (low, high) in FIELD_RANGES.items():
        _check_range(name, getattr(cfg, name), low, high)
    if _weights_bound(cfg) > MAX_WEIGHTS:
        raise ConfigError(
            f"a model this wide (mlp_dim {cfg.mlp_dim}, enc_dim {cfg.enc_dim}, latent_dim "
            f"{cfg.latent_dim}, {cfg.num_q} Qs, {cfg.num_enc_layers} encoder layers) would hold "
            f"over {MAX_WEIGHTS / 1e9:.0f} billion weights: the largest preset holds 317 million",
            "mlp_dim",
        )
    for name, knob in knobs("agent").items():  # the live knobs' ranges: agent/knobs.py
        if getattr(cfg, name) != knob.auto:
            knob.check(getattr(cfg, name))
    if cfg.num_pi_trajs >= cfg.num_samples:
        raise ConfigError(
            f"num_pi_trajs must be below num_samples ({cfg.num_samples}), got {cfg.num_pi_trajs}",
            "num_pi_trajs",
        )
    if cfg.num_elites > cfg.num_samples:
        raise ConfigError(
            f"num_elites must be at most num_samples ({cfg.num_samples}), got {cfg.num_elites}",
            "num_elites",
        )
    if cfg.merge_pull != 1.0 and (cfg.outer_lr != 1.0 or cfg.outer_momentum != 0.0):
        # PAPA pulls each worker toward the mean; DiLoCo's step moves the pool's anchor, which
        # every worker takes: a pull toward the stepped anchor is neither method.
        raise ConfigError(
            f"merge_pull {cfg.merge_pull:g} does not go with the outer step (outer_lr "
            f"{cfg.outer_lr:g}, outer_momentum {cfg.outer_momentum:g}): the pull moves each "
            "worker toward the mean, the outer step moves the pool's anchor that every worker "
            "takes; set merge_pull to 1, or outer_lr to 1 and outer_momentum to 0",
            "merge_pull",
        )
    if cfg.min_std > cfg.max_std:
        raise ConfigError(
            f"min_std ({cfg.min_std}) must not exceed max_std ({cfg.max_std})", "min_std"
        )
    if cfg.latent_dim % cfg.simnorm_dim:
        raise ConfigError(
            f"latent_dim ({cfg.latent_dim}) must be a multiple of simnorm_dim ({cfg.simnorm_dim})",
            "latent_dim",
        )
    if cfg.vmin >= cfg.vmax:
        raise ConfigError(f"vmin ({cfg.vmin}) must be below vmax ({cfg.vmax})", "vmin")
    if cfg.env_kwargs and not isinstance(_json_object(cfg.env_kwargs), dict):
        raise ConfigError(
            f"env_kwargs must be a JSON object such as '{{\"frame_skip\": 2}}', got "
            f"{cfg.env_kwargs!r}",
            "env_kwargs",
        )
    if cfg.obs not in OBS_KINDS:
        raise ConfigError(
            f"obs must be state or rgb (the authors' two; rgb: 64x64 camera frames), got "
            f"{cfg.obs!r}",
            "obs",
        )
    if cfg.fast_path not in FAST_PATHS:
        raise ConfigError(
            f"fast_path must be {', '.join(FAST_PATHS[:-1])} or {FAST_PATHS[-1]}, got "
            f"{cfg.fast_path!r}",
            "fast_path",
        )
    if cfg.fast_path in ("graphs", "compile") and not cfg.compile:
        raise ConfigError(
            f"fast_path {cfg.fast_path} compiles: it cannot go with compile off", "fast_path"
        )
    if cfg.device not in ("auto", "cpu", "cuda") and not cfg.device.startswith("cuda:"):
        raise ConfigError(f"device must be cpu, cuda or auto, got {cfg.device!r}", "device")


def make_config(model_size: int = 5, **overrides: object) -> Config:
    """Config for a model-size preset, then explicit overrides (unknown names are refused)."""
    if model_size not in MODEL_SIZES:
        sizes = ", ".join(str(s) for s in MODEL_SIZES)
        raise ConfigError(f"model_size must be one of {sizes}, got {model_size}", "model_size")
    names = {f.name for f in fields(Config)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(
            f"unknown config field(s): {', '.join(unknown)}",
            unknown[0] if len(unknown) == 1 else None,
        )
    return Config(**{**overrides, "model_size": model_size})


def with_knobs(cfg: Config, **values: object) -> Config:
    """A copy of cfg with live knobs changed, validated; non-knob fields are refused."""
    table = knobs("agent")
    not_knobs = sorted(set(values) - set(table))
    if not_knobs:
        raise ConfigError(f"not a live knob: {', '.join(not_knobs)} (knobs: {', '.join(table)})")
    return replace(cfg, **{name: table[name].check(value) for name, value in values.items()})


def knobs_of(cfg: Config) -> dict[str, float]:
    """The live-knob values of a config."""
    return {name: getattr(cfg, name) for name in knobs("agent")}


@cache
def field_docs() -> dict[str, str]:
    """The one-line doc string written under each Config field."""
    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr):
            docs[node.target.id] = str(after.value.value)
    return docs


def to_dict(cfg: Config) -> dict[str, object]:
    return dataclasses.asdict(cfg)
