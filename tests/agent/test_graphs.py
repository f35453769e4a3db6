"""The pack's plan and update have no host synchronisation: what CUDA graphs need to replay
them whole. Checked on the CPU by tracing them with TorchDynamo (no GPU needed)."""

import torch
from conftest import tiny_config

from agent.agent import TDMPC2
from agent.noise import PackNoise
from agent.planner import plan

OBS, ACT = 5, 2


def _pack(monkeypatch):
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)  # the batched path, a GPU's
    agent = TDMPC2(tiny_config(), OBS, ACT, seeds=[1, 2])
    agent.noise = PackNoise([1, 2], "cpu", shared=True)  # as under CUDA graphs
    return agent


def test_the_pack_plan_is_one_graph(monkeypatch):
    agent = _pack(monkeypatch)
    warm = torch.zeros(2, 3, agent.cfg.horizon, ACT)
    args = (agent.model, agent.two_hot, torch.randn(2, 3, OBS), warm, agent.plan_knobs())
    with torch.no_grad():
        explained = torch._dynamo.explain(plan)(*args, False, agent.noise)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1


def test_the_pack_update_breaks_only_at_backward_and_the_optimiser_steps(monkeypatch):
    agent = _pack(monkeypatch)
    h, b = agent.cfg.horizon, agent.cfg.batch_size
    batch = (
        torch.randn(2, h + 1, b, OBS),
        torch.rand(2, h, b, ACT) * 2 - 1,
        torch.rand(2, h, b, 1),
        torch.zeros(2, h, b, 1),
    )
    agent.model.train()
    explained = torch._dynamo.explain(agent._update)(*batch)
    lines = [r.user_stack[-1].line for r in explained.break_reasons if r.user_stack]
    # The two losses' backward calls and the optimisers' own graph breaks (torch.optim makes one
    # around every step), nothing else: no .item(), no Python branch on a tensor.
    allowed = {"loss.sum().backward()", "torch._dynamo.graph_break()"}
    assert set(lines) <= allowed, lines
    assert explained.graph_count <= 7
