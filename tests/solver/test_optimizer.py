"""build_optimizer: parameter groups, optimizer choice and kernels, gradient clipping."""
import pytest
import torch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.solver import add_gradient_clipping, build_optimizer, is_norm_module
from reid_engine.solver.optimizer import _kernel_kwargs, check_optimizer_config
from reid_engine.utils.registry import UnknownChoiceError


class FrozenBN(nn.Module):
    """Stand-in for a norm layer defined outside torch (recognised by its class name)."""

    def __init__(self, channels):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))


class TinyReid(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, bias=True), nn.BatchNorm2d(4), FrozenBN(4))
        self.heads = nn.ModuleDict({"neck": nn.BatchNorm1d(4), "classifier": nn.Linear(4, 3, bias=False)})
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


def _cfg(**solver):
    cfg = get_cfg()
    cfg.SOLVER.update(solver)
    return cfg


GROUP_CFG = dict(OPT="SGD", BASE_LR=0.1, WEIGHT_DECAY=1e-4, WEIGHT_DECAY_NORM=0.0, BIAS_LR_FACTOR=2.0,
                 WEIGHT_DECAY_BIAS=0.0, HEADS_LR_FACTOR=10.0)


def _hyper_by_name(optimizer):
    return {name: (group["lr"], group["weight_decay"])
            for group in optimizer.param_groups for name in group["param_names"]}


def test_param_groups_get_lr_and_weight_decay_by_kind():
    optimizer = build_optimizer(_cfg(**GROUP_CFG), TinyReid())
    hyper = _hyper_by_name(optimizer)
    assert hyper == pytest.approx({
        "backbone.0.weight": (0.1, 1e-4),          # plain weight
        "backbone.0.bias": (0.2, 0.0),             # bias: lr x BIAS_LR_FACTOR, WEIGHT_DECAY_BIAS
        "backbone.1.weight": (0.1, 0.0),           # norm weight: WEIGHT_DECAY_NORM
        "backbone.1.bias": (0.2, 0.0),
        "backbone.2.weight": (0.1, 0.0),           # FrozenBN found by name
        "backbone.2.bias": (0.2, 0.0),
        "heads.neck.weight": (1.0, 0.0),           # heads: lr x HEADS_LR_FACTOR
        "heads.neck.bias": (2.0, 0.0),
        "heads.classifier.weight": (1.0, 1e-4),
    })
    assert "frozen.weight" not in hyper  # requires_grad False is skipped


def test_param_groups_are_merged_where_lr_and_decay_are_equal():
    optimizer = build_optimizer(_cfg(**GROUP_CFG), TinyReid())
    # distinct (lr, wd): (0.1,1e-4) (0.2,0) (0.1,0) (1,0) (2,0) (1,1e-4)
    assert len(optimizer.param_groups) == 6
    same = build_optimizer(_cfg(OPT="SGD", BASE_LR=0.1, WEIGHT_DECAY=1e-4, WEIGHT_DECAY_NORM=1e-4,
                                BIAS_LR_FACTOR=1.0, WEIGHT_DECAY_BIAS=1e-4, HEADS_LR_FACTOR=1.0), TinyReid())
    assert len(same.param_groups) == 1 and len(same.param_groups[0]["params"]) == 9


def test_shared_parameters_are_counted_once():
    model = TinyReid()
    model.heads["tied"] = model.backbone[0]
    optimizer = build_optimizer(_cfg(**GROUP_CFG), model)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == 9


def test_norm_detection():
    for module in (nn.BatchNorm2d(2), nn.SyncBatchNorm(2), nn.GroupNorm(1, 2), nn.InstanceNorm2d(2, affine=True),
                   nn.LayerNorm(2), FrozenBN(2)):
        assert is_norm_module(module), type(module).__name__
    for module in (nn.Linear(2, 2), nn.Conv2d(2, 2, 1), nn.Sequential(nn.BatchNorm2d(2))):
        assert not is_norm_module(module)


def test_sgd_gets_momentum_and_nesterov_and_the_fused_kernel_on_cpu():
    optimizer = build_optimizer(_cfg(OPT="SGD", MOMENTUM=0.8, NESTEROV=True), TinyReid())
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["momentum"] == 0.8 and optimizer.defaults["nesterov"] is True
    assert optimizer.defaults["fused"] is True and not optimizer.defaults.get("foreach")


@pytest.mark.parametrize("name", ["Adam", "AdamW", "RMSprop", "Adamax"])
def test_any_torch_optimizer_by_name(name):
    optimizer = build_optimizer(_cfg(OPT=name, BASE_LR=0.01), TinyReid())
    assert type(optimizer) is getattr(torch.optim, name)
    assert optimizer.defaults["lr"] == 0.01
    assert "momentum" not in optimizer.defaults or optimizer.defaults["momentum"] == 0  # SGD only


def test_kernel_choice():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert _kernel_kwargs(torch.optim.Adam, cuda) == {"fused": True}
    assert _kernel_kwargs(torch.optim.SGD, cuda) == {"fused": True}
    assert _kernel_kwargs(torch.optim.Adamax, cuda) == {"foreach": True}  # no fused kernel
    assert _kernel_kwargs(torch.optim.Adam, cpu) == {"fused": True}
    assert _kernel_kwargs(torch.optim.Adamax, cpu) == {}  # foreach is slower than per-tensor on CPU
    assert _kernel_kwargs(torch.optim.LBFGS, cpu) == {}


def test_unknown_optimizer_lists_valid_names():
    with pytest.raises(UnknownChoiceError, match="unknown SOLVER.OPT 'Adamm': choose one of .*Adam, .*SGD"
                                                 ".*; did you mean Adam[?]"):
        build_optimizer(_cfg(OPT="Adamm"), TinyReid())
    with pytest.raises(UnknownChoiceError, match="unknown SOLVER.OPT 'adamw'.*did you mean AdamW[?]"):
        check_optimizer_config(_cfg(OPT="adamw"))
    assert check_optimizer_config(_cfg(OPT="SGD")) is torch.optim.SGD


# ---- clipping ------------------------------------------------------------------------

def _two_params_with_grads():
    a = nn.Parameter(torch.zeros(2))
    b = nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([3.0, 4.0])   # norm 5
    b.grad = torch.tensor([0.3, -0.4])  # norm 0.5
    return a, b


def test_clip_by_norm_clips_each_parameter():
    a, b = _two_params_with_grads()
    optimizer = torch.optim.SGD([a, b], lr=0.0)
    add_gradient_clipping(optimizer, "norm", 1.0, 2.0)
    optimizer.step()
    assert torch.allclose(a.grad, torch.tensor([0.6, 0.8]), atol=1e-5)
    assert torch.allclose(b.grad, torch.tensor([0.3, -0.4]))  # under the threshold


def test_clip_full_model_norm():
    a, b = _two_params_with_grads()
    optimizer = torch.optim.SGD([a, b], lr=0.0)
    add_gradient_clipping(optimizer, "full_model", 1.0, 2.0)
    optimizer.step()
    total = torch.cat([a.grad, b.grad]).norm().item()
    assert total == pytest.approx(1.0, rel=1e-4)
    assert torch.allclose(a.grad / b.grad, torch.tensor([10.0, -10.0]))  # direction kept


def test_clip_by_value():
    a, b = _two_params_with_grads()
    optimizer = torch.optim.SGD([a, b], lr=0.0)
    add_gradient_clipping(optimizer, "value", 0.35, 2.0)
    optimizer.step()
    assert torch.equal(a.grad, torch.tensor([0.35, 0.35]))
    assert torch.allclose(b.grad, torch.tensor([0.3, -0.35]))


def test_build_optimizer_adds_clipping_from_config():
    model = nn.Linear(2, 1, bias=False)
    cfg = _cfg(OPT="SGD", BASE_LR=1.0, MOMENTUM=0.0, WEIGHT_DECAY=0.0)
    cfg.SOLVER.CLIP_GRADIENTS.update(ENABLED=True, CLIP_TYPE="value", CLIP_VALUE=0.1)
    optimizer = build_optimizer(cfg, model)
    with torch.no_grad():
        model.weight.zero_()
    model(torch.tensor([[100.0, -100.0]])).sum().backward()
    optimizer.step()
    assert torch.allclose(model.weight, torch.tensor([[-0.1, 0.1]]))  # step of the clipped grad


def test_bad_clip_type_is_a_clear_error():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(UnknownChoiceError, match="unknown SOLVER.CLIP_GRADIENTS.CLIP_TYPE 'nrom': choose one "
                                                 "of value, norm, full_model; did you mean norm[?]"):
        add_gradient_clipping(optimizer, "nrom", 1.0)


def _amp_step(fused, clip_type):
    """One GradScaler step of a tiny model; returns the updated weight."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    # SGD, not Adam: the first Adam step is lr * sign(grad), blind to the clipping magnitude
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **({"fused": True} if fused else {"foreach": True}))
    add_gradient_clipping(optimizer, clip_type, 0.01, 2.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    loss = (model(torch.randn(5, 4)) * 100).pow(2).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return model.weight.detach().clone(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("clip_type", ["norm", "value", "full_model"])
def test_clipping_sees_unscaled_gradients_under_amp(clip_type):
    weight, grads = _amp_step(fused=False, clip_type=clip_type)
    # GradScaler unscaled before the step, so the pre-hook clipped the true gradients
    if clip_type == "norm":
        assert all(g.norm().item() <= 0.01 + 1e-6 for g in grads)
    elif clip_type == "value":
        assert all(g.abs().max().item() <= 0.01 + 1e-7 for g in grads)
    else:
        assert torch.cat([g.flatten() for g in grads]).norm().item() <= 0.01 + 1e-6
    # a fused optimizer unscales inside its step: the threshold is scaled instead, same update
    fused_weight, _ = _amp_step(fused=True, clip_type=clip_type)
    assert torch.allclose(weight, fused_weight, atol=1e-6)
