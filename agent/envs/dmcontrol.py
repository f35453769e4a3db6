"""DeepMind Control Suite tasks as gymnasium environments: flat state observations, or stacked
camera frames as the authors take them (agent/pixels.py), actions in [-1, 1], action repeat,
fixed episode length, seeding and offscreen RGB rendering."""

from __future__ import annotations

import ctypes.util
import os
import warnings

import gymnasium
import numpy as np

from agent.errors import ConfigError
from agent.pixels import OBS_DIM, SIZE, FrameStack, camera_of


def choose_gl_backend() -> str:
    """Set MUJOCO_GL to a backend that renders offscreen here, unless the user chose one."""
    if "MUJOCO_GL" not in os.environ:
        for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa")):
            if ctypes.util.find_library(library):
                os.environ["MUJOCO_GL"] = backend
                break
        else:
            os.environ["MUJOCO_GL"] = "glfw"
    if os.environ["MUJOCO_GL"] in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    # GLFW warns at import when there is no display; a render that then fails says so in its
    # error (a pixel run refuses to start with it, agent/envs/make.py's check_renders).
    warnings.filterwarnings("ignore", module="glfw")
    return os.environ["MUJOCO_GL"]


choose_gl_backend()

from dm_control import suite  # noqa: E402  (MUJOCO_GL must be set before this import)


def canonical(name: str) -> str:
    """A DMControl name as the table keys it: lower case, dashes."""
    return name.strip().lower().replace("_", "-")


TASKS: dict[str, tuple[str, str]] = {
    canonical(f"{domain}-{task}"): (domain, task) for domain, task in suite.ALL_TASKS
}
TASKS["cup-catch"] = ("ball_in_cup", "catch")  # the name used by the TD-MPC2 authors


def task_names() -> list[str]:
    return sorted(TASKS)


def resolve_task(name: str) -> tuple[str, str]:
    """(domain, task) for a name like walker-walk; an unknown name lists the valid ones."""
    try:
        return TASKS[canonical(name)]
    except KeyError:
        raise ConfigError(
            f"unknown task {name!r}; valid tasks: {', '.join(task_names())}"
        ) from None


class DMControlEnv(gymnasium.Env):
    """One DMControl task. An agent step repeats the action `action_repeat` control steps."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        task: str,
        seed: int = 0,
        action_repeat: int = 2,
        episode_length: int = 500,
        render_size: tuple[int, int] = (240, 320),
        camera_id: int = 0,
        obs: str = "state",
    ):
        """`obs`: "state" (the flat state vector) or "rgb" (the last frames of the authors'
        camera for the domain, agent/pixels.py)."""
        domain, task_name = resolve_task(task)
        self.task_name, self.obs = task, obs
        self._env = suite.load(domain, task_name, task_kwargs={"random": seed})
        self.action_repeat, self.episode_length = action_repeat, episode_length
        self.render_size, self.camera_id = render_size, camera_id
        self.render_mode = "rgb_array"
        spec = self._env.action_spec()
        self._low, self._high = spec.minimum.astype(np.float64), spec.maximum.astype(np.float64)
        self.pixel_camera = camera_of(domain)
        self._stack = FrameStack() if obs == "rgb" else None
        if self._stack is not None:
            self.observation_space = gymnasium.spaces.Box(0, 255, (OBS_DIM,), np.uint8)
        else:
            obs_dim = sum(int(np.prod(s.shape)) for s in self._env.observation_spec().values())
            self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, spec.shape, np.float32)
        self._t = 0

    def _observe(self, observation: dict, first: bool = False) -> np.ndarray:
        """The state flattened, or the stacked frames with the camera's new one."""
        if self._stack is None:
            parts = [np.asarray(v, dtype=np.float32).ravel() for v in observation.values()]
            return np.concatenate(parts)
        frame = self.pixel_frame()
        return self._stack.reset(frame) if first else self._stack.push(frame)

    def pixel_frame(self) -> np.ndarray:
        """What the agent's camera sees now, as a pixel observation's frame (HWC uint8)."""
        return self._env.physics.render(height=SIZE, width=SIZE, camera_id=self.pixel_camera)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._env.task.random.seed(seed)
        self._t = 0
        observation = self._observe(self._env.reset().observation, first=True)
        return observation, {"state": self.physics_state()}

    def step(self, action: np.ndarray):
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        scaled = self._low + (action + 1.0) * 0.5 * (self._high - self._low)
        reward = 0.0
        for _ in range(self.action_repeat):
            step = self._env.step(scaled)
            reward += step.reward or 0.0
            if step.last():
                break
        self._t += 1
        # DMControl tasks never terminate; their time limit is a truncation.
        truncated = self._t >= self.episode_length or step.last()
        info = {"state": self.physics_state()}
        return self._observe(step.observation), reward, False, truncated, info

    def render(self, camera_id: int | None = None) -> np.ndarray:
        height, width = self.render_size
        cam = self.camera_id if camera_id is None else camera_id
        return self._env.physics.render(height=height, width=width, camera_id=cam)

    @property
    def physics(self):
        return self._env.physics

    # the viewport's face, as GymEnv's
    renders = True

    @property
    def mujoco_model(self):
        return self._env.physics.model

    def physics_state(self) -> np.ndarray:
        """The pose (MuJoCo's qpos): all a replay needs to draw this moment again."""
        return self._env.physics.data.qpos.copy()

    def show_state(self, state: np.ndarray) -> None:
        """Put the model in a recorded pose, for render() (the simulation does not step)."""
        physics = self._env.physics
        physics.data.qpos[:] = state
        physics.forward()

    def camera_names(self) -> list[str]:
        """The task's cameras in id order ("camera K" for an unnamed one)."""
        model = self._env.physics.model
        return [model.id2name(i, "camera") or f"camera {i}" for i in range(model.ncam)]

    @property
    def control_timestep(self) -> float:
        """Seconds of simulated time per agent step (real speed for the viewport)."""
        return self._env.physics.timestep() * self.action_repeat

    def close(self) -> None:
        # Closing the physics first avoids OSMesa's noisy error at interpreter exit.
        self._env.close()
