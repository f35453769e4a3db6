"""The front door: flags and presets, a new run from the flags, headless training, a rank of a
torchrun job and the desktop menu entry."""
