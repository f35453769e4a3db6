"""What the trainer calls between its steps (TrainingHooks), and how a hook ends training early
as asked (StopTraining). The worker process's hooks are hooks.py; a trainer on its own has none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from workers.training.trainer import Trainer


class StopTraining(Exception):
    """Raised by a hook to end training early, as requested (not an error)."""


class TrainingHooks(Protocol):
    """What the trainer calls while it runs; any of them may raise StopTraining."""

    def after_step(self, trainer: Trainer) -> None:
        """After every agent step (summed over envs)."""

    def after_update(self, trainer: Trainer) -> None:
        """After every update: pretraining's thousands take minutes on a CPU, and a pause or
        stop must not wait for them."""

    def during_evaluation(self, trainer: Trainer) -> None:
        """After every step of an evaluation (minutes on a CPU, too)."""


class NoHooks:
    """A trainer on its own: nothing runs between its steps."""

    def after_step(self, trainer: Trainer) -> None:
        pass

    def after_update(self, trainer: Trainer) -> None:
        pass

    def during_evaluation(self, trainer: Trainer) -> None:
        pass
