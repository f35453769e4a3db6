"""The number format: bf16 by default where the CPU's flags show a bf16 unit, and the start-up
line that says so."""

import torch

import workers.host.precision as precision
from agent.agent import matmul_precision
from agent.cpu.bf16 import native_bf16
from workers.cli.presets import demo_preset, preset_config
from workers.host.precision import bf16_by_default, describe_precision

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
    declined = describe_precision(False, "cpu", EPYC)
    assert "float32" in declined and "avx512_bf16" in declined and "--no-bf16" in declined
    chosen = describe_precision(True, "cpu", SAPPHIRE)
    assert "bf16" in chosen and "amx_bf16" in chosen and "--no-bf16" in chosen
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


def test_bf16_is_the_default_on_a_cpu_with_a_bf16_unit_only():
    assert bf16_by_default("cpu", EPYC) and bf16_by_default("cpu", SAPPHIRE)
    assert not bf16_by_default("cpu", OLD)
    # "auto" is CUDA where there is one (float32 with TF32 there), else this CPU
    assert bf16_by_default("auto", EPYC) == (not torch.cuda.is_available())


def test_runs_from_a_preset_take_bf16_where_the_cpu_has_the_unit_unless_told(monkeypatch):
    for flag in ("avx512_bf16", None):
        monkeypatch.setattr(precision, "native_bf16", lambda cpuinfo=None, flag=flag: flag)
        preset = demo_preset("cpu")
        assert preset_config(preset, device="cpu").bf16 == (flag is not None)
        assert preset_config(preset, device="cpu", bf16=False).bf16 is False
        assert preset_config(preset, device="cpu", bf16=True).bf16 is True
