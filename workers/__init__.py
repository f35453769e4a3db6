"""Training processes, weight merging and the run directory. Imports agent/, never viewer/;
the window and bench's whole runs come in through door.py."""
