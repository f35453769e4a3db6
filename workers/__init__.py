"""Training processes, weight merging and the run directory. Imports agent/, never viewer/."""
