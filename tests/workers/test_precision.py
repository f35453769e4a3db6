"""The start-up line's number format: native bf16 is found from the CPU's flags."""

import torch

from agent.agent import matmul_precision
from agent.cpu.bf16 import native_bf16
from workers.host.precision import describe_precision

EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n"
OLD = "flags\t\t: fpu sse2 avx2 fma\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert native_bf16(EPYC) == "avx512_bf16"
    assert native_bf16(SAPPHIRE) == "amx_bf16"
    assert native_bf16(OLD) is None
    assert native_bf16("") is None


def test_the_start_up_line_says_what_was_chosen_and_why():
    assert describe_precision(False, "cpu", OLD) == "precision: float32"
    offered = describe_precision(False, "cpu", EPYC)
    assert "float32" in offered and "avx512_bf16" in offered and "--bf16" in offered
    assert "native (amx_bf16)" in describe_precision(True, "cpu", SAPPHIRE)
    assert "no bf16 unit" in describe_precision(True, "cpu", OLD)


def test_cuda_matmuls_run_in_tf32_as_the_authors_and_cpus_are_left_alone():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        matmul_precision(torch.device("cpu"))
        assert torch.get_float32_matmul_precision() == "highest"
        matmul_precision(torch.device("cuda"))  # sets the flag; no GPU needed to set it
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
