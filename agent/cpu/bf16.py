"""bf16 on a CPU: the same numbers with or without a bf16 unit.

Under torch.autocast a matmul takes bf16 inputs, accumulates in float32 and rounds its result to
bf16; the ops around it run on those bf16 tensors. Where the CPU has a bf16 unit (AVX512-BF16 or
AMX) that is fast. Elsewhere PyTorch computes bf16 matmuls with a reference kernel, about 100x
slower than float32 (BENCHMARKS.md "bf16"), while bf16 elementwise ops cost what float32's do.
There `emulate_bf16_matmuls` has autocast compute each matmul in float32 on the bf16 inputs
and round the result to bf16: a product of two bf16 numbers is exact in float32, so this is the
unit's own arithmetic up to the order of the sums, in forward and backward, at float32's speed.
It lets any machine run (and measure the learning of) bf16 numerics.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names, best first

_MATMULS = ("mm", "bmm", "addmm", "baddbmm")
_emulation: torch.library.Library | None = None  # kept alive: dropping it unregisters
_emulation_lock = threading.Lock()  # a pack's threads may ask at once


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


def _in_float32(op: torch._ops.OpOverload):
    """Autocast's kernel for `op` with the same numbers, its matmul in float32: the inputs
    rounded to bf16 (products of bf16 numbers are exact in float32), the sum rounded once."""
    no_autocast = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(no_autocast):
            wide = [_rounded(a) for a in args]
            return op(*wide, **kwargs).to(torch.bfloat16)

    return kernel


def _rounded(x: object) -> object:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(torch.bfloat16).float()
    return x


def emulate_bf16_matmuls() -> None:
    """Replace autocast's CPU kernels of the matmuls (forward and, as backward runs under the
    same autocast, backward) by _in_float32's, for this process. Idempotent."""
    global _emulation
    with _emulation_lock:
        if _emulation is not None:
            return
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "overriding a previously registered kernel": meant
            warnings.simplefilter("ignore", UserWarning)
            for name in _MATMULS:
                op = getattr(torch.ops.aten, name).default
                library.impl(name, _in_float32(op), "AutocastCPU")
        _emulation = library


@contextlib.contextmanager
def cpu_bf16(native: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on the CPU; without a bf16 unit (`native` False) its matmuls run in
    float32 on the same rounded numbers. Thread-local, as autocast is."""
    if not native:
        emulate_bf16_matmuls()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield
