import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TDMPC2_LIVE_NO_BOOTSTRAP", "1")
torch.set_num_threads(2)

from agent.config import make_config  # noqa: E402


def tiny_config(**overrides):
    """A small but complete config: every code path, a fraction of the FLOPs."""
    base = dict(
        device="cpu",
        task="cartpole-balance",
        enc_dim=32,
        mlp_dim=64,
        latent_dim=32,
        batch_size=32,
        num_samples=64,
        num_elites=8,
        num_pi_trajs=4,
        iterations=2,
    )
    return make_config(1, **{**base, **overrides})


@pytest.fixture
def tiny_cfg():
    return tiny_config()
