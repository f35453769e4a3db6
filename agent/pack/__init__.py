"""A pack: several workers' networks as one batched model in one process. Its state (merging
inside the pack, one worker's state read and written as a lone agent's), its threads on a CPU,
and the merge rule that says what the workers take from a merge."""
