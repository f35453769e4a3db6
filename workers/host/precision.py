"""Which number format this machine's CPU computes natively, said at start-up. bf16 matmuls on a
CPU are fast only where the CPU has them in hardware (AVX512-BF16 or AMX); elsewhere PyTorch
emulates them, slower than float32. Whether bf16 learns as float32 does is a separate question,
measured before it becomes a default (issue 24); until then it is chosen with --bf16."""

from __future__ import annotations

from agent.agent import resolve_device
from agent.cpu.bf16 import native_bf16


def describe_precision(bf16: bool, device: str, cpuinfo: str | None = None) -> str:
    """The start-up line: the number format the workers compute in, and why (`device`: the
    config's, "auto" included)."""
    if resolve_device(device).type == "cuda":
        return "precision: float32 with TF32 matmuls (CUDA, as the authors run it)"
    native = native_bf16(cpuinfo)
    if bf16:
        how = f"native ({native})" if native else "no bf16 unit: matmuls in float32, same numbers"
        return f"precision: bf16 matmuls (--bf16; {how})"
    if native:
        return (
            f"precision: float32 (this CPU computes bf16 natively, {native}: --bf16 uses it; "
            "not the default until its learning curve is measured)"
        )
    return "precision: float32"
