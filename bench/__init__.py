"""Benchmarks, apart from the program they measure: `launch.py bench` (bench/cli.py) and
`python -m bench.load`. Only launch.py imports this room. It may import agent/ and viewer/; it
enters workers/ by the window's door (workers/door.py) for whole runs, races and flags, and
reaches inside only to time one part alone: a merge (merging/), a trainer (training/, rundir/),
the threads of a pack (host/). tests/test_house.py holds both."""
