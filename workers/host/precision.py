"""Which number format this machine's CPU computes natively, said at start-up. bf16 matmuls on a
CPU are fast only where the CPU has them in hardware (AVX512-BF16 or AMX); elsewhere PyTorch
emulates them, slower than float32. Whether bf16 learns as float32 does is a separate question,
measured before it becomes a default (issue 24); until then it is chosen with --bf16."""

from __future__ import annotations

from pathlib import Path

from agent.agent import resolve_device

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names, best first


def native_bf16(cpuinfo: str | None = None) -> str | None:
    """The CPU flag that gives this machine native bf16 matmuls, or None. `cpuinfo`: the text
    of /proc/cpuinfo (read when not given; None where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return next((flag for flag in NATIVE_BF16_FLAGS if flag in flags), None)


def describe_precision(bf16: bool, device: str, cpuinfo: str | None = None) -> str:
    """The start-up line: the number format the workers compute in, and why (`device`: the
    config's, "auto" included)."""
    if resolve_device(device).type == "cuda":
        return "precision: float32 with TF32 matmuls (CUDA, as the authors run it)"
    native = native_bf16(cpuinfo)
    if bf16:
        how = f"native ({native})" if native else "emulated: this CPU has no bf16 unit, slower"
        return f"precision: bf16 matmuls (--bf16; {how})"
    if native:
        return (
            f"precision: float32 (this CPU computes bf16 natively, {native}: --bf16 uses it; "
            "not the default until its learning curve is measured)"
        )
    return "precision: float32"
