"""One training process: its spec, entry, first weights, the trainer's step loop and the hooks
it runs between agent steps (knobs, merge rounds, checkpoints, the disk guard)."""
