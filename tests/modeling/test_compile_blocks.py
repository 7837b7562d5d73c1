"""MODEL.COMPILE_SCOPE blocks: which modules are a model's repeated blocks, compiling them in place
(outputs and state_dict keys of eager), turning them eager for a while or for good, and the plan's
choice. CPU, torch.compile with the eager backend (dynamo's tracing without code generation)."""
import pytest
import torch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.modeling import build_model
from reid_engine.runtime.compile import compile_model, compiled_modules, eager_calls, repeated_blocks, uncompile_model
from reid_engine.runtime.compiled import compile_record, is_compiled
from reid_engine.runtime.run_plan import build_run_plan, compile_scope_decision
from reid_engine.utils.registry import UnknownChoiceError


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()  # process-wide: earlier tests' graphs
    yield
    torch._dynamo.reset()


def _bot(depth="50x", size=(64, 32), scope="blocks", compile_mode="off", backbone="build_resnet_backbone"):
    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.BACKBONE.NAME", backbone, "MODEL.BACKBONE.DEPTH", depth,
                         "MODEL.BACKBONE.PRETRAIN", False, "MODEL.HEADS.NUM_CLASSES", 8, "INPUT.SIZE_TRAIN", list(size),
                         "INPUT.SIZE_TEST", list(size), "MODEL.COMPILE", compile_mode, "MODEL.COMPILE_BACKEND", "eager",
                         "MODEL.COMPILE_SCOPE", scope, "MODEL.CHANNELS_LAST", "off"])
    return cfg


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc, self.bn = nn.Linear(width, width), nn.BatchNorm1d(width)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x))) + x


class Net(nn.Module):
    """Two block shapes, a non-repeated stem and head, and a repeated parameter-free module."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.blocks = nn.Sequential(Block(8), Block(8), Block(8))
        self.wide = nn.Sequential(nn.Linear(8, 16), Block(16))
        self.head = nn.Linear(16, 2)
        self.acts = nn.ModuleList([nn.ReLU(), nn.ReLU()])

    def forward(self, x):
        return self.head(self.wide(self.blocks(self.acts[0](self.stem(x)))))


def test_repeated_blocks_are_the_outermost_repeated_classes_of_our_own():
    net = Net()
    assert repeated_blocks(net) == [net.blocks[0], net.blocks[1], net.blocks[2], net.wide[1]]
    assert repeated_blocks(nn.Sequential(Block(4))) == []  # nothing repeats


def test_resnet50_and_vit_blocks():
    model = build_model(_bot())
    names = [type(b).__name__ for b in repeated_blocks(model)]
    assert names == ["Bottleneck"] * 16
    vit = build_model(_bot(depth="small", size=(64, 32), backbone="build_vit_backbone"))
    vit_blocks = repeated_blocks(vit)
    assert len(vit_blocks) >= 8 and len({type(b) for b in vit_blocks}) == 1


def test_compiled_blocks_give_eager_outputs_and_keys_and_turn_eager():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(5, 4)
    want = net(x)
    keys = list(net.state_dict())
    compile_model(net, "default", backend="eager", scope="blocks")
    assert compile_record(net).scope == "blocks" and compiled_modules(net) == repeated_blocks(net)
    assert is_compiled(net) and getattr(net, "_compiled_call_impl", None) is None  # the blocks, not the whole
    torch.testing.assert_close(net(x), want, rtol=0, atol=0)
    assert list(net.state_dict()) == keys
    graphs = len(torch._dynamo.utils.get_compilation_metrics())
    assert graphs == 2  # one per block shape (8 and 16 wide), shared by the three 8-wide blocks
    with eager_calls(net):
        assert not is_compiled(net)
        net(x)
    assert is_compiled(net) and len(torch._dynamo.utils.get_compilation_metrics()) == graphs
    uncompile_model(net)
    assert not is_compiled(net) and compile_record(net).mode == "off"


def test_vit_blocks_with_growing_drop_path_rates_share_one_graph():
    # The stochastic-depth rate grows with depth; as a buffer it is a graph input, not a guard.
    from reid_engine.modeling.backbones.vit import VisionTransformer
    from reid_engine.modeling.backbones.vit_layers import ViTSpec

    spec = ViTSpec(dim=16, depth=4, heads=2, mlp_ratio=2.0, qkv_bias=True)
    torch.manual_seed(0)
    vit = VisionTransformer(spec, img_size=(32, 16), stride=(16, 16), drop_path=0.3).train()
    rates = [round(float(b.drop_path.rate), 6) for b in vit.blocks]
    assert rates == [0.0, 0.1, 0.2, 0.3] and all(b.drop_path.active for b in vit.blocks)
    assert "rate" not in " ".join(vit.state_dict())  # checkpoints keep fast-reid's keys
    x = torch.randn(3, 3, 32, 16)
    torch.manual_seed(1)
    want = vit(x)
    compile_model(vit, "default", backend="eager", scope="blocks")
    torch.manual_seed(1)
    torch.testing.assert_close(vit(x), want)  # the same masks: the same random draws in the same order
    assert len(torch._dynamo.utils.get_compilation_metrics()) == 1  # before: one graph per rate


def test_drop_path_at_rate_zero_in_an_active_model_is_exact():
    from reid_engine.modeling.backbones.vit_layers import DropPath

    x = torch.randn(4, 5, 6)
    assert torch.equal(DropPath(0.0, active=True).train()(x), x)
    assert DropPath(0.0).active is False and DropPath(0.2).active is True
    dropped = DropPath(0.5).train()(torch.ones(2000, 1, 1))
    assert set(dropped.unique().tolist()) == {0.0, 2.0} and 0.4 < dropped.mean() / 2 < 0.6


def test_a_model_without_repeated_blocks_compiles_whole():
    net = nn.Sequential(Block(4))
    compile_model(net, "default", backend="eager", scope="blocks")
    assert compile_record(net).scope == "model" and is_compiled(net) and compiled_modules(net) == [net]


def test_the_plan_compiles_whole_under_auto_and_blocks_when_layers_are_frozen_first():
    assert compile_scope_decision("auto", "reduce-overhead")[0] == "model"
    assert compile_scope_decision("auto", "reduce-overhead", freezes=True)[0] == "blocks"
    assert compile_scope_decision("model", "default", freezes=True) == ("model", "MODEL.COMPILE_SCOPE model")
    assert compile_scope_decision("blocks", "off")[0] == "model"  # nothing is compiled
    with pytest.raises(UnknownChoiceError, match="MODEL.COMPILE_SCOPE"):
        compile_scope_decision("layers", "default")
    cfg = _bot(scope="auto", compile_mode="default")
    assert build_run_plan(cfg, log=False).compile_scope == "model"
    cfg.merge_from_list(["SOLVER.FREEZE_ITERS", 10, "MODEL.FREEZE_LAYERS", ["backbone"]])
    plan = build_run_plan(cfg, log=False)
    assert plan.compile_scope == "blocks" and "blocks" in dict((r[0], r[1]) for r in plan.rows())["compile"]
    model = build_model(cfg, plan)
    assert compile_record(model).scope == "blocks" and len(compile_record(model).regions) == 16
