"""Benchmarks, apart from the program they measure: `launch.py bench` (bench/cli.py) and
`python -m bench.load`. This room may import agent/, workers/ and viewer/; only launch.py
imports it."""
