"""The showcase: a player process that acts with the shown weights and renders frames into
shared memory for the window."""
