"""How a hook between the trainer's steps (trainer.py TrainingHooks) ends training early."""


class StopTraining(Exception):
    """Raised by a hook to end training early, as requested (not an error)."""
