"""A race: the run's workers split into lanes that train side by side with their own knob values
and merge pools, how a race is started and changed (control.py), and its table: each lane's
score over training (scores.py), ranked with the merge gain (table.py), and said in words
(text.py)."""
