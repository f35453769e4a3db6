"""The pack's plan and update are one graph each, with no host synchronisation: what CUDA graphs
need to replay them whole. Checked on the CPU by tracing them with TorchDynamo and by compiling
the update with Inductor for the CPU (no GPU needed)."""

import dataclasses
import math
import warnings

import pytest
import torch
from conftest import random_batch, tiny_config

from agent.agent import TDMPC2
from agent.noise import PackNoise
from agent.optim_step import adam_step, init_adam_state
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


def _batch(agent, seed=0):
    """A pack's batch: each worker's from conftest's random_batch."""
    parts = [random_batch(agent.cfg, OBS, ACT, 10 * seed + k) for k in range(agent.pack)]
    return tuple(torch.stack(column) for column in zip(*parts))


@pytest.mark.parametrize("reset", [False, True], ids=["pack", "a worker reset alone"])
def test_the_pack_update_is_one_graph(monkeypatch, reset):
    agent = _pack(monkeypatch)
    agent._compile(mode=None)  # lazily: nothing is compiled until called
    if reset:  # its own Adam step count, in the graph as well (PackState.step_offset)
        for optim in (agent.optim, agent.pi_optim):
            for state in optim.state.values():
                state["step"].fill_(5)
        agent.assign(agent.model_state(0), [0, 1], reset=[1])
        assert agent.step_offset.tolist() == [0, 5]
    agent.model.train()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        explained = torch._dynamo.explain(agent._update)(*_batch(agent))
    # Both backward calls and both Adam steps inside: no .item(), no Python branch on a
    # tensor, no torch.optim graph break.
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1


def test_adam_step_is_torchs_adam_step():
    torch.manual_seed(0)
    shapes = [(3, 4), (4,), (2, 2, 2)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]

    def adam(params):  # two groups, as the agent's: the encoder's own learning rate
        return torch.optim.Adam(
            [{"params": params[:1], "lr": 0.3e-3}, {"params": params[1:]}], lr=1e-3, eps=1e-5
        )

    ours_optim, theirs_optim = adam(ours), adam(theirs)
    init_adam_state(ours_optim)
    for step in range(4):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape) * (step + 1)
            b.grad = a.grad.clone()
        if step == 2:  # a parameter without a gradient is left as it is by both
            ours[1].grad = theirs[1].grad = None
        adam_step(ours_optim)
        theirs_optim.step()
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ours_optim.state[a][key], theirs_optim.state[b][key]), key


class _FixedNoise:
    """The same numbers for eager and compiled code (their random streams differ)."""

    def __init__(self, pack):
        self.pack = pack

    def normal(self, *shape):
        return torch.linspace(-1, 1, self.pack * math.prod(shape)).view(self.pack, *shape)

    def uniform(self, *shape):
        return torch.linspace(0, 1, self.pack * math.prod(shape)).view(self.pack, *shape).flip(-1)

    def q_pair(self, num_q):
        return self.uniform(num_q).argsort(-1)[:, :2]


def test_the_compiled_one_graph_update_is_the_eager_update(monkeypatch):
    # Compiled by Inductor for the CPU (about 2 minutes here): the same graph a GPU compiles,
    # less the CUDA graphs. Its random numbers are the eager update's, drawn from the same
    # generator state (Inductor's fallback_random, which the start-up self-check relies on to
    # replay a compiled call eagerly). Dropout is off: on a CPU the eager one is this
    # project's own (agent/cpu/fast_ops.py), another stream than PyTorch's.
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    cfg = dataclasses.replace(tiny_config(), dropout=0.0)
    eager, compiled = (TDMPC2(cfg, OBS, ACT, seeds=[1, 2]) for _ in range(2))
    for agent in (eager, compiled):
        agent.noise = PackNoise([1, 2], "cpu", shared=True)  # as a compiled pack draws
    compiled._compile(mode=None)
    for step in range(3):
        batch = _batch(eager, step)
        torch.manual_seed(step)
        a = eager.update(batch)
        torch.manual_seed(step)
        b = compiled.update(batch)
        assert compiled.fused_update
        for name in ("total_loss", "pi_loss", "grad_norm", "pi_grad_norm", "q_scale"):
            assert torch.allclose(a[name], b[name], rtol=1e-4, atol=1e-5), (step, name)
    for (name, x), y in zip(eager.model.state_dict().items(), compiled.model.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-5), name
    steps = {
        float(s["step"]) for o in (compiled.optim, compiled.pi_optim) for s in o.state.values()
    }
    assert steps == {3.0}


def test_an_update_that_does_not_compile_whole_falls_back_to_graph_breaks(monkeypatch):
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    eager, compiled = (TDMPC2(tiny_config(), OBS, ACT, seeds=[1, 2]) for _ in range(2))
    compiled._compile(mode="default")  # lazily: nothing is compiled until called

    def does_not_compile(*batch):
        raise torch._dynamo.exc.TorchDynamoException("Unsupported: a graph break\ndetails")

    compiled._update_fn = does_not_compile
    compiles = []
    monkeypatch.setattr(torch, "compile", lambda fn, **o: compiles.append((fn, o)) or fn)
    torch.manual_seed(0)
    a = eager.update(_batch(eager))
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="does not compile as one graph .Unsupported: a graph"):
        b = compiled.update(_batch(compiled))
    assert not compiled.fused_update  # torch.optim's own steps from now on
    for name in ("total_loss", "pi_loss", "grad_norm"):
        assert torch.equal(a[name], b[name]), name
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        compiled.update(_batch(compiled, 1))
    # Compiled once, with graph breaks, in the mode asked for.
    assert compiles == [(compiled._update, {"mode": "default"})]


def test_compiling_asks_for_whole_graphs_on_static_adam_state(monkeypatch):
    """What _compile asks of torch.compile, checked without compiling: the plan and the update
    each whole (fullgraph) in the mode given, the update with backward traced in, and Adam's
    state made beforehand (step 0, zero moments) and marked static for CUDA graphs; the update
    it runs is then the eager one, stepped by adam_step."""
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    cfg = dataclasses.replace(tiny_config(), dropout=0.0)
    eager, compiled = (TDMPC2(cfg, OBS, ACT, seeds=[1, 2]) for _ in range(2))
    asked, traced = [], []

    def fake_compile(fn, **options):
        asked.append((fn, options))

        def run(*args, **kwargs):
            traced.append(torch._dynamo.config.trace_autograd_ops)
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    compiled._compile("reduce-overhead")
    assert (compiled.compiled, compiled.fused_update) == (True, True)
    whole = {"mode": "reduce-overhead", "fullgraph": True}
    assert [(getattr(fn, "__func__", fn), o) for fn, o in asked] == [
        (TDMPC2._update, whole),
        (plan, whole),
    ]
    for optim in (compiled.optim, compiled.pi_optim):
        for group in optim.param_groups:
            for p in group["params"]:
                state = optim.state[p]
                assert state["step"].dtype == torch.float32 and float(state["step"]) == 0
                assert state["step"].device.type == "cpu"  # not capturable: a host step
                for key in ("exp_avg", "exp_avg_sq"):
                    assert state[key].shape == p.shape and not state[key].any()
                for tensor in state.values():
                    assert getattr(tensor, "_dynamo_static_input_type", None) == "unguarded"
    compiled.noise = _FixedNoise(2)
    eager.noise = _FixedNoise(2)
    batch = _batch(eager)
    a, b = eager.update(batch), compiled.update(batch)
    assert traced == [True]
    for name in ("total_loss", "pi_loss", "grad_norm", "pi_grad_norm"):
        assert torch.allclose(a[name], b[name]), name
    for x, y in zip(eager.model.parameters(), compiled.model.parameters()):
        assert torch.allclose(x, y, atol=1e-6)


@pytest.mark.parametrize("option", ["amsgrad", "fused"])
def test_adam_state_is_made_for_plain_adam_only(option):
    param = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(AssertionError, match="plain Adam"):
        init_adam_state(torch.optim.Adam([param], **{option: True}))


def test_a_compiled_agent_marks_loaded_adam_state_static():
    cfg = dataclasses.replace(tiny_config(), dropout=0.0)
    saved = TDMPC2(cfg, OBS, ACT)
    saved.update(random_batch(cfg, OBS, ACT))
    loaded = TDMPC2(cfg, OBS, ACT)
    loaded.compiled = True  # as on CUDA: a load replaces the tensors CUDA graphs replay
    loaded.load_state_dict(saved.state_dict())
    for optim in (loaded.optim, loaded.pi_optim):
        for state in optim.state.values():
            for tensor in state.values():
                assert getattr(tensor, "_dynamo_static_input_type", None) == "unguarded"


def test_a_pixel_packs_plan_and_update_are_one_graph_each(monkeypatch):
    """From pixels too (the GPU fast path): the random shift's draws, the index that shifts,
    the grouped convolutions of the pack and the uint8 batch trace without a break."""
    from agent.pixels import OBS_DIM

    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    cfg = tiny_config(obs="rgb")
    agent = TDMPC2(cfg, OBS_DIM, ACT, seeds=[1, 2])
    agent.noise = PackNoise([1, 2], "cpu", shared=True)  # as under CUDA graphs
    obs = torch.randint(0, 256, (2, 3, OBS_DIM), dtype=torch.uint8).float()
    warm = torch.zeros(2, 3, cfg.horizon, ACT)
    with torch.no_grad():
        explained = torch._dynamo.explain(plan)(
            agent.model, agent.two_hot, obs, warm, agent.plan_knobs(), False, agent.noise
        )
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    agent._compile(mode=None)
    agent.model.train()
    h, b = cfg.horizon, cfg.batch_size
    batch = (
        torch.randint(0, 256, (2, h + 1, b, OBS_DIM), dtype=torch.uint8),
        torch.rand(2, h, b, ACT) * 2 - 1,
        torch.rand(2, h, b, 1),
        torch.zeros(2, h, b, 1),
    )
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        explained = torch._dynamo.explain(agent._update)(*batch)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
