"""The number format the workers compute in on this machine, and the start-up line that says it.

bf16 is the default on a CPU with a bf16 unit (AVX512-BF16 or AMX): there an update and a plan
take 0.73x float32's time at 5M (0.82x at 1M on one thread), and its learning curves stayed
within float32's seeds (BENCHMARKS.md, "bf16 against float32"); raced per training time with
replicas it learned as fast per agent step and ran 1.16x the steps (BENCHMARKS.md, "Merge rules
raced"). It is a live knob: a run can switch between steps. Elsewhere float32 stays the
default: without the unit bf16 numbers cost float32's time or more (agent/cpu/bf16.py) and gain
nothing. On CUDA the workers run float32 with TF32 matmuls, as the authors do."""

from __future__ import annotations

from agent.agent import resolve_device
from agent.cpu.bf16 import native_bf16


def bf16_by_default(device: str, cpuinfo: str | None = None) -> bool:
    """Whether a run on `device` (the config's, "auto" included) computes in bf16 unless told
    otherwise: on a CPU that has a bf16 unit."""
    return resolve_device(device).type == "cpu" and native_bf16(cpuinfo) is not None


def describe_precision(bf16: bool, device: str, cpuinfo: str | None = None) -> str:
    """The start-up line: the number format the workers compute in, and why."""
    if resolve_device(device).type == "cuda":
        return "precision: float32 with TF32 matmuls (CUDA, as the authors run it)"
    native = native_bf16(cpuinfo)
    if bf16 and native:
        return f"precision: bf16 matmuls on this CPU's {native} unit (--no-bf16: float32)"
    if bf16:
        return "precision: bf16 numbers (--bf16; no bf16 unit: matmuls in float32, no faster)"
    if native:
        return f"precision: float32 (--no-bf16; this CPU's {native} unit would run bf16)"
    return "precision: float32"
