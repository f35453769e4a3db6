"""What only a CPU needs: faster Mish and dropout, bf16 numbers without a bf16 unit, and a pack's
workers on threads of their own."""
