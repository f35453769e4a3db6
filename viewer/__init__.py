"""The Dear PyGui window. Imports workers/ only through its door, workers/door.py (the run API,
the new run, presets, flags, the race's types, records; tests/test_house.py holds it)."""
