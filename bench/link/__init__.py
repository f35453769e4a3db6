"""Benchmarks of the remote link: a connected window's delays and a server under attack."""
