"""Averaging workers' weights: through files and locks on one machine, or as one all-reduce."""
