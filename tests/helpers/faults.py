"""Faults injected into a real agent for the self-check's tests: a CPU pack whose threads mix up
their workers, and torch.compile replaced by a stand-in whose CUDA graphs raise at capture,
perturb the loss or replay a stale input."""

import torch

import agent.pack.threads as pack_threads


def _flipped(result):
    """A pack's result with its workers in reverse order."""
    if isinstance(result, torch.Tensor):
        return result.flip(0)
    if isinstance(result, dict):
        return {k: _flipped(v) for k, v in result.items()}
    return tuple(_flipped(x) for x in result)


def mix_up_workers(monkeypatch) -> None:
    """A CPU pack whose threads hand each worker's results to another (their gradients stay
    right): a pack that is unsound."""
    real = pack_threads.WorkerThreads.map
    monkeypatch.setattr(pack_threads.WorkerThreads, "map", lambda *a, **k: _flipped(real(*a, **k)))


def fake_compile(fault: str | None):
    """torch.compile's stand-in: the function itself, except in CUDA graphs' mode, where it
    raises at capture ("raise"), scales the update's total loss by 1.01 ("perturb"), or
    replays the first call's inputs ("stale")."""

    def compile_(fn, mode=None, **options):
        if mode != "reduce-overhead" or fault is None:
            return fn
        first = []

        def compiled(*args):
            if fault == "raise":
                raise RuntimeError("CUDA graphs: operation not permitted when stream is capturing")
            if fault == "stale":
                first.extend([] if first else [args])
                return fn(*first[0])
            out = fn(*args)
            if isinstance(out, dict):
                out["total_loss"] = out["total_loss"] * 1.01
            return out

        return compiled

    return compile_
