"""What only a CPU needs: faster Mish and dropout, and bf16 numbers without a bf16 unit. A layer
of its own: nothing here imports the rest of agent/ (a pack's threads are agent/pack/threads.py)."""
