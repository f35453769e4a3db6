"""Any gymnasium environment as TD-MPC2 takes one: by its registry id (Humanoid-v5) or
gymnasium's `module:EnvId` form, which imports the module so that it registers its envs.

What TD-MPC2 needs is checked when the env is made: continuous Box actions (any finite bounds,
rescaled to [-1, 1] as DMControl's are) and Box observations, or a Dict of Boxes flattened in
sorted key order. A termination stays a termination and the time limit a truncation."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from agent.envs.named import check_task_named, import_named
from agent.errors import ConfigError

NEEDS = "TD-MPC2 needs continuous Box actions and Box (or Dict of Box) state observations"


def is_gym_id(task: str) -> bool:
    """Whether `task` names a gymnasium env: registered, or `module:EnvId` (which imports it)."""
    if ":" in task:
        return True
    return task in gymnasium.registry


def check_record_task(task: str) -> None:
    """A task read from a run directory: ConfigError unless its module (if any) was named
    here, then imported now, so that a module that may not be imported is refused in one line
    here, not in each process started later."""
    check_task_named(task)
    if task.rpartition(":")[0]:
        gym_spec(task)


def gym_spec(task: str) -> gymnasium.envs.registration.EnvSpec:
    """The registry's entry for `task` (importing `module` first for `module:EnvId`, when a
    person named it: check_task_named)."""
    module, _, env_id = task.rpartition(":")
    if module:
        check_task_named(task)
        # A user's module with a bug raises anything at import, or calls sys.exit, whose
        # SystemExit would end the program (or a worker) with no word of why.
        try:
            import_named(module)
        except ConfigError:
            raise
        except (Exception, SystemExit) as err:
            what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            first = what.strip().splitlines()[0]
            raise ConfigError(f"{task}: cannot import {module!r} ({first})", "task") from None
    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error as err:
        raise ConfigError(f"unknown gymnasium environment {task!r}: {err}", "task") from None


# gymnasium's own envs whose episodes end only at the time limit (their docs: "never
# terminates"); the MuJoCo ones that terminate when unhealthy stop doing so when asked
# (terminate_when_unhealthy=False).
NEVER_TERMINATE = frozenset(
    {"HalfCheetah", "Swimmer", "Reacher", "Pusher", "HumanoidStandup", "Pendulum"}
)


def can_terminate(task: str, env_kwargs: dict | None = None) -> bool:
    """Whether an episode of `task` can end in a terminal state, not only at its time limit.
    Known for gymnasium's own envs; any other env may, so it is taken to."""
    entry = gym_spec(task).entry_point
    if not (isinstance(entry, str) and entry.startswith("gymnasium.envs.")):
        return True
    name = task.rpartition(":")[2].rsplit("-v", 1)[0]
    if name in NEVER_TERMINATE:
        return False
    return (env_kwargs or {}).get("terminate_when_unhealthy", True) is not False


def time_limit(task: str) -> int | None:
    """The env's own episode limit in env steps (its TimeLimit), or None."""
    return gym_spec(task).max_episode_steps


def check_contract(task: str, env_kwargs: dict | None = None) -> None:
    """Make the env once and run gymnasium's own checker on it (reset, step, spaces, seeding;
    not rendering): a failure is one ConfigError line, before a run writes anything."""
    env = _make(task, (240, 320), dict(env_kwargs or {}))
    try:
        check_spaces(task, env.observation_space, env.action_space)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
    except ConfigError:
        raise
    except Exception as err:  # the checker asserts; a broken env raises anything
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{task} fails gymnasium's env check: {first}", "task") from None
    finally:
        env.close()


def _flat_size(space: spaces.Space, task: str, what: str) -> int:
    if isinstance(space, spaces.Box):
        if space.dtype == np.uint8 and len(space.shape) >= 2:
            raise ConfigError(f"{task}: {NEEDS}; its {what} is an image {space.shape}", "task")
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Dict):
        return sum(_flat_size(space[key], task, f"{what}[{key!r}]") for key in sorted(space))
    raise ConfigError(f"{task}: {NEEDS}; its {what} is {space}", "task")


def check_spaces(task: str, observation: spaces.Space, action: spaces.Space) -> int:
    """The flat observation size; ConfigError (one line) when TD-MPC2 cannot use the env."""
    if not isinstance(action, spaces.Box) or not np.issubdtype(action.dtype, np.floating):
        raise ConfigError(f"{task}: {NEEDS}; its action space is {action}", "task")
    if not (np.all(np.isfinite(action.low)) and np.all(np.isfinite(action.high))):
        raise ConfigError(f"{task}: {NEEDS} with finite bounds; its are {action}", "task")
    return _flat_size(observation, task, "observation space")


def flatten(observation: Any) -> np.ndarray:
    """One float32 vector: a Dict's entries in sorted key order, each flattened."""
    if isinstance(observation, dict):
        return np.concatenate([flatten(observation[key]) for key in sorted(observation)])
    return np.asarray(observation, dtype=np.float32).ravel()


class GymEnv(gymnasium.Env):
    """One gymnasium env behind the same face as DMControlEnv: flat float32 observations,
    actions in [-1, 1], `action_repeat` env steps per agent step (rewards summed, stopped by a
    termination), at most `episode_length` agent steps, RGB frames of `render_size`."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        task: str,
        seed: int = 0,
        action_repeat: int = 1,
        episode_length: int = 1000,
        render_size: tuple[int, int] = (240, 320),
        camera_id: int = -1,
        env_kwargs: dict | None = None,
    ):
        self.task_name, self.seed = task, seed
        self.action_repeat, self.episode_length = action_repeat, episode_length
        self.render_size, self.camera_id = render_size, camera_id
        self.render_mode = "rgb_array"
        self._env = _make(task, render_size, dict(env_kwargs or {}))
        inner = self._env.action_space
        obs_dim = check_spaces(task, self._env.observation_space, inner)
        self._low, self._high = inner.low.astype(np.float64), inner.high.astype(np.float64)
        self.observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, inner.shape, np.float32)
        self._t = 0
        self._seeded = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None and not self._seeded:
            seed = self.seed  # the first episode of a fresh env is the worker's own
        self._seeded = True
        self._t = 0
        self._env.action_space.seed(seed)
        obs, info = self._env.reset(seed=seed, options=options)
        return flatten(obs), self._state_info()

    def scale(self, action: np.ndarray) -> np.ndarray:
        """[-1, 1] to the env's own bounds."""
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        return self._low + (action + 1.0) * 0.5 * (self._high - self._low)

    def step(self, action: np.ndarray):
        scaled = self.scale(action).astype(self._env.action_space.dtype)
        reward, terminated, truncated = 0.0, False, False
        for _ in range(self.action_repeat):
            obs, r, terminated, truncated, _ = self._env.step(scaled)
            reward += float(r)
            if terminated or truncated:
                break
        self._t += 1
        truncated = bool(truncated or (self._t >= self.episode_length and not terminated))
        return flatten(obs), reward, bool(terminated), truncated, self._state_info()

    # replays: a MuJoCo env's pose in and out (other envs have none, and are not replayed)
    def _state_info(self) -> dict:
        state = self.physics_state()
        return {} if state is None else {"state": state}

    def physics_state(self) -> np.ndarray | None:
        """The pose (MuJoCo's qpos) of a MuJoCo env, else None."""
        data = getattr(self._env.unwrapped, "data", None)
        return None if self.mujoco_model is None or data is None else data.qpos.copy()

    def show_state(self, state: np.ndarray) -> None:
        """Put the model in a recorded pose, for render() (the simulation does not step)."""
        import mujoco

        data = self._env.unwrapped.data
        data.qpos[:] = state
        mujoco.mj_forward(self.mujoco_model, data)

    # rendering: the viewport's, through the env's own rgb_array mode
    @property
    def renders(self) -> bool:
        return self._env.render_mode == "rgb_array"

    def camera_names(self) -> list[str]:
        """The MuJoCo model's cameras in id order ([] for an env without a MuJoCo model)."""
        model = self.mujoco_model
        if model is None:
            return []
        import mujoco

        return [
            mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) or f"camera {i}"
            for i in range(model.ncam)
        ]

    def render(self, camera_id: int | None = None) -> np.ndarray | None:
        """An RGB frame, or None from an env that does not render."""
        if not self.renders:
            return None
        renderer = getattr(self._env.unwrapped, "mujoco_renderer", None)
        camera = self.camera_id if camera_id is None else camera_id
        if renderer is not None:  # a camera the model lacks: the env's own view (-1)
            renderer.camera_id = camera if 0 <= camera < self.mujoco_model.ncam else -1
        return self._env.render()

    @property
    def mujoco_model(self):
        """The MuJoCo model of a MuJoCo-based env, else None."""
        model = getattr(self._env.unwrapped, "model", None)
        return model if model is not None and hasattr(model, "vis") else None

    @property
    def control_timestep(self) -> float:
        """Seconds of simulated time per agent step (real speed for the viewport)."""
        dt = getattr(self._env.unwrapped, "dt", None)
        fps = self._env.metadata.get("render_fps")
        step = float(dt) if dt else (1.0 / fps if fps else 0.02)
        return step * self.action_repeat

    def close(self) -> None:
        self._env.close()  # closes its renderer too (an unclosed EGL context warns at exit)


def _make(task: str, render_size: tuple[int, int], env_kwargs: dict) -> gymnasium.Env:
    """The env with rgb_array rendering at the viewport's size where it takes one (MuJoCo
    envs take width and height), else as it renders, else without rendering."""
    gym_spec(task)  # an unknown id or module: one line
    height, width = render_size
    attempts = (
        {"render_mode": "rgb_array", "width": width, "height": height},
        {"render_mode": "rgb_array"},
        {},
    )
    last: Exception | None = None
    for extra in attempts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return gymnasium.make(task, **{**extra, **env_kwargs})
        except TypeError as err:  # an argument this env does not take
            last = err
        except gymnasium.error.Error as err:
            last = err
    raise ConfigError(f"{task}: cannot be made with {env_kwargs or 'no'} arguments: {last}", "task")
