"""Test helpers importable by name, also in the worker processes a run spawns."""
