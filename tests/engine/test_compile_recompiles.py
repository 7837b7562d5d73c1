"""Every shipped config family through the real DefaultTrainer under torch.compile, on the CPU:
no graph break in the training step, no recompilation after warm-up except the documented
ones, and the losses of eager.

Each family's shipped config file is shrunk (a quarter-width ResNet with one block per stage, or
a 2-block 64-wide ViT; 64x32 images; SyntheticReIDTiny) and trained for 2 epochs with an
evaluation after each, compiled with a cheap backend: what torch.compile decides (guards,
graph breaks, recompilations) does not depend on the backend, nor on the device.

Documented recompilations (README, "Compiled training: architectures"):
- when MODEL.FREEZE_LAYERS are released (the frozen modules' ``training`` flag is a guard);
- the first evaluation (the eval-mode graph). Its batch size differs from training's, so
  dynamo compiles it with a dynamic batch and the last, smaller batch compiles nothing more;
  later evaluations and the training steps between them compile nothing.
Each family also trains its first steps with MODEL.COMPILE_SCOPE blocks (its repeated blocks
compiled one by one): the same losses, and no training step after the first compiles a graph (but
the release). Run time: about 60 s of CPU for the module (9 families: whole model, blocks and eager).
"""
import logging
import os
from typing import Dict, List, Optional, Tuple

import pytest
import torch

from reid_engine.engine.train_loop import HookBase
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

# Losses of the first compiled steps against eager (same seeds, same batches), relative.
LOSS_RTOL = 1e-4
LOSS_ATOL = 1e-5
# Steps before the graphs are expected to be stable (the first step compiles).
WARMUP_STEPS = 1
# Steps whose losses are compared with eager: past the release of the frozen layers (step 3).
COMPARED_STEPS = 6
# Backends: "eager" (dynamo alone: guards, graph breaks and recompilations) is the cheapest;
# aot_eager adds AOT autograd (the functionalised in-place writes of MoCo's queue).
BACKENDS = {"moco": "aot_eager"}

_TINY = [
    "MODEL.DEVICE", "cpu", "MODEL.BACKBONE.PRETRAIN", False, "INPUT.SIZE_TRAIN", "[64, 32]",
    "INPUT.SIZE_TEST", "[64, 32]", "INPUT.AUTOAUG.ENABLED", False, "INPUT.CJ.ENABLED", False,
    "DATASETS.NAMES", '("SyntheticReIDTiny",)', "DATASETS.TESTS", '("SyntheticReIDTiny",)',
    "DATALOADER.NUM_WORKERS", 0, "DATALOADER.NUM_INSTANCE", 4, "SOLVER.IMS_PER_BATCH", 16,
    "SOLVER.AMP.ENABLED", False, "SOLVER.WARMUP_ITERS", 2, "SOLVER.CHECKPOINT_PERIOD", 100,
    "TEST.IMS_PER_BATCH", 64, "SEED", 0, "CUDNN_BENCHMARK", False,
]
# "tiny" members (registered by the `tiny_depths` fixture): each family's own blocks, one per stage.
_RESNET = ["MODEL.BACKBONE.DEPTH", "tiny", "MODEL.BACKBONE.WIDTH_MULT", 0.25]
# SBS recipes: the freeze ends at iteration 3, the cosine decay starts after epoch 1
_SBS = ["SOLVER.FREEZE_ITERS", 3, "SOLVER.DELAY_EPOCHS", 1]
# The other SBS-based recipes without the freeze (SBS proves its recompile; each costs a compile)
_SBS_NO_FREEZE = ["SOLVER.FREEZE_ITERS", 0, "SOLVER.DELAY_EPOCHS", 1]
_TINY_TEACHER = """_BASE_: {base}
MODEL:
  BACKBONE: {{DEPTH: tiny, WIDTH_MULT: 0.25, WITH_NL: False, PRETRAIN: False}}
"""

# family -> (config file, extra overrides)
FAMILIES = {
    "bot": ("configs/Market1501/bagtricks_R50.yml", _RESNET),
    "agw": ("configs/Market1501/AGW_R50.yml", _RESNET),
    # the freeze ends at iteration 3 and the cosine decay starts at epoch 1
    "sbs": ("configs/Market1501/sbs_R50.yml", _RESNET + _SBS),
    # 96 rows: b3's map keeps 6 rows, enough for its 3 stripes
    "mgn": ("configs/Market1501/mgn_R50-ibn.yml", _RESNET + _SBS_NO_FREEZE + [
        "INPUT.SIZE_TRAIN", "[96, 32]", "INPUT.SIZE_TEST", "[96, 32]"]),
    "moco": ("configs/Market1501/bagtricks_R50_moco.yml", _RESNET + ["MODEL.QUEUE_SIZE", 64]),
    "kd": ("configs/Market1501/kd-sbs_R101-ibn-sbs_R34.yml", _RESNET + _SBS_NO_FREEZE),
    "kd-ema": ("configs/Market1501/kd-ema_sbs_R34.yml", _RESNET + _SBS_NO_FREEZE),
    "transreid": ("configs/Market1501/transreid_vit.yml", [
        "MODEL.BACKBONE.DEPTH", "tiny", "MODEL.JPM.NUM_PARTS", 2]),
    # evaluation batches of 16 tracklets (not training's 8): the eval graph starts with a dynamic batch
    "video": ("configs/SyntheticReID/video_bagtricks_R18_quick.yml", _RESNET + [
        "DATASETS.NAMES", '("SyntheticVideoReIDTiny",)', "DATASETS.TESTS", '("SyntheticVideoReIDTiny",)',
        "INPUT.SEQ_LEN", 2, "DATALOADER.NUM_INSTANCE", 2, "SOLVER.IMS_PER_BATCH", 8, "TEST.IMS_PER_BATCH", 16]),
}


@pytest.fixture(scope="module")
def tiny_depths():
    """Register the "tiny" ResNet (one block per stage, non-local blocks in stages 2 and 3) and
    ViT (64 wide, 2 blocks) for the module."""
    from reid_engine.modeling.backbones import resnet, vit

    patch = pytest.MonkeyPatch()
    patch.setitem(resnet.RESNET_DEPTHS, "tiny", (resnet.BasicBlock, (1, 1, 1, 1)))
    patch.setitem(resnet._NON_LOCAL_PER_STAGE, "tiny", (0, 1, 1, 0))
    patch.setitem(vit.VIT_DEPTHS, "tiny", vit.ViTSpec(dim=64, depth=2, heads=2))
    yield
    patch.undo()
    torch._dynamo.reset()  # free the compiled graphs of the last family


def make_teacher(folder: str, num_classes: int = 24) -> list:
    """A tiny frozen teacher for the distiller (config file and weights written to `folder`):
    the KD.* overrides."""
    from reid_engine.config import get_cfg
    from reid_engine.modeling.meta_arch.baseline import Baseline

    config = os.path.join(folder, "teacher.yml")
    with open(config, "w") as f:
        f.write(_TINY_TEACHER.format(base=os.path.join(REPO_ROOT, "configs/Market1501/sbs_R101-ibn.yml")))
    cfg = get_cfg()
    cfg.merge_from_file(config)
    cfg.MODEL.HEADS.NUM_CLASSES = num_classes
    weights = os.path.join(folder, "teacher.pth")
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same teacher for the compiled and the eager run
        torch.save({"model": Baseline.from_config(cfg).state_dict()}, weights)
    return ["KD.MODEL_CONFIG", f"('{config}',)", "KD.MODEL_WEIGHTS", f"('{weights}',)"]


def _compile_counts() -> Tuple[int, int, List[str]]:
    """(graphs compiled, graph breaks met, recompile reasons) so far in this process."""
    counters = torch._dynamo.utils.counters
    reasons = [r for rs in torch._dynamo.utils.guard_failures.values() for r in rs]
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()), reasons


class CompileRecorder(HookBase):
    """Graphs dynamo compiled, and graph breaks it met, in each training step (forward and
    backward) and between steps (optimizer step, evaluation, checkpoints), and the recompile
    reasons of each phase."""

    def __init__(self):
        self.in_step: List[Tuple[int, int]] = []  # (graphs, breaks) per step
        self.between: List[Tuple[int, int]] = []  # (graphs, breaks) after each step
        self.reasons: Dict[str, List[str]] = {}
        self._mark = (0, 0, 0)

    def _snapshot(self, phase: str, into: List[Tuple[int, int]]) -> None:
        graphs, breaks, reasons = _compile_counts()
        into.append((graphs - self._mark[0], breaks - self._mark[1]))
        if len(reasons) > self._mark[2]:
            self.reasons[phase] = reasons[self._mark[2]:]
        self._mark = (graphs, breaks, len(reasons))

    def before_step(self):
        if self.trainer.iter > self.trainer.start_iter:
            self._snapshot(f"after step {self.trainer.iter - 1}", self.between)
        else:
            self._snapshot("set-up", [])

    def after_backward(self):
        self._snapshot(f"step {self.trainer.iter}", self.in_step)

    def after_train(self):
        self._snapshot(f"after step {self.trainer.iter}", self.between)

    def explain(self) -> str:
        """Torch's recompile reasons, by phase (for failure messages)."""
        return "\n".join(f"{phase}:\n  " + "\n  ".join(reasons) for phase, reasons in self.reasons.items())


def _build_cfg(name: str, data_root: str, out: str, compile_mode: str, backend: str, scope: str = "model"):
    from reid_engine.config import get_cfg

    path, extra = FAMILIES[name]
    if name == "kd":
        os.makedirs(out, exist_ok=True)
        extra = extra + make_teacher(out)
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, path))
    cfg.merge_from_list(_TINY + list(extra) + [
        "DATASETS.ROOT", data_root, "OUTPUT_DIR", out, "MODEL.COMPILE", compile_mode,
        "MODEL.COMPILE_BACKEND", backend, "MODEL.COMPILE_SCOPE", scope, "SOLVER.MAX_EPOCH", 2,
        "TEST.EVAL_PERIOD", 1])
    return cfg


def run_family(name: str, data_root: str, out: str, compile_mode: str, backend: str,
               scope: str = "model", steps: Optional[int] = None) -> Dict[str, object]:
    """Train family `name` for 2 epochs with an evaluation after each (SEED 0), or only its first
    `steps` steps (the same schedule) and one evaluation at the end.

    Returns:
        {"losses": the loss dict of each step (floats), "recorder": its CompileRecorder,
        "breaks": dynamo's graph-break counter, "cfg": the trainer's config}.
    """
    from reid_engine.engine.defaults import DefaultTrainer
    from reid_engine.utils.env import seed_all_rng

    logging.getLogger("reid_engine").setLevel(logging.WARNING)  # else DefaultTrainer sets up logging
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.guard_failures.clear()
    cfg = _build_cfg(name, data_root, out, compile_mode, backend, scope)
    seed_all_rng(cfg.SEED)
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    if steps is not None:
        trainer.max_iter = min(steps, trainer.max_iter)
    losses: List[Dict[str, float]] = []
    inner = trainer._trainer
    stage = inner._stage_metrics

    def record(loss_dict, data_time):
        losses.append({k: float(v.detach()) for k, v in loss_dict.items()})
        return stage(loss_dict, data_time)

    inner._stage_metrics = record
    recorder = CompileRecorder()
    trainer.register_hooks([recorder])
    trainer.train()
    return {"losses": losses, "recorder": recorder, "breaks": dict(torch._dynamo.utils.counters["graph_break"]),
            "cfg": trainer.cfg, "iters_per_epoch": trainer.iters_per_epoch}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_compiled_without_recompiling_and_matches_eager(family, data_root, tiny_depths, tmp_path):
    backend = BACKENDS.get(family, "eager")
    compiled = run_family(family, data_root, str(tmp_path / "compiled"), "default", backend)
    recorder, cfg = compiled["recorder"], compiled["cfg"]
    why = f"{family} ({backend}); graph breaks: {compiled['breaks']}; torch's recompile reasons:\n{recorder.explain()}"
    release = cfg.SOLVER.FREEZE_ITERS if cfg.MODEL.FREEZE_LAYERS and cfg.SOLVER.FREEZE_ITERS else None
    first_eval = compiled["iters_per_epoch"] - 1
    assert len(recorder.in_step) == 2 * compiled["iters_per_epoch"] and recorder.in_step[0][0] > 0
    assert all(breaks == 0 for _, breaks in recorder.in_step), f"the training step breaks its graph in {why}"
    for step, (graphs, _) in enumerate(recorder.in_step[WARMUP_STEPS:], start=WARMUP_STEPS):
        if step == release:  # documented: the frozen modules' training flag
            assert 0 < graphs <= recorder.in_step[0][0], f"step {step}: {graphs} graphs for the release in {why}"
        else:
            assert graphs == 0, f"step {step} compiled {graphs} graphs in {why}"
    for step, (graphs, breaks) in enumerate(recorder.between):
        if step == first_eval:  # documented: the eval-mode graph, once
            assert graphs > 0, f"the first evaluation compiled nothing in {why}"
            # VideoBaseline's tracklet evaluation runs eager by design (tracklets of every length)
            assert (breaks > 0) == (family == "video"), f"evaluation breaks its graph in {why}"
        else:
            assert graphs == 0, f"{graphs} graphs compiled after step {step} (evaluation, optimizer) in {why}"
    # MODEL.COMPILE_SCOPE blocks (auto's choice): after the first step's graphs (one per block
    # shape), training compiles nothing but the release of the frozen layers. The blocks and the
    # eager run train only the steps compared (the release included).
    blocks = run_family(family, data_root, str(tmp_path / "blocks"), "default", backend, scope="blocks",
                        steps=COMPARED_STEPS)
    block_why = f"{family} blocks ({backend}); torch's recompile reasons:\n{blocks['recorder'].explain()}"
    for step, (graphs, _) in enumerate(blocks["recorder"].in_step[WARMUP_STEPS:], start=WARMUP_STEPS):
        if step != release:
            assert graphs == 0, f"step {step} compiled {graphs} graphs in {block_why}"
    eager = run_family(family, data_root, str(tmp_path / "eager"), "off", backend, steps=COMPARED_STEPS)
    assert len(eager["losses"]) == len(blocks["losses"]) == min(COMPARED_STEPS, len(compiled["losses"]))
    for run in (compiled, blocks):
        for step, (got, want) in enumerate(zip(run["losses"][:COMPARED_STEPS], eager["losses"])):
            assert got.keys() == want.keys()
            for name in want:
                assert got[name] == pytest.approx(want[name], rel=LOSS_RTOL, abs=LOSS_ATOL), \
                    f"{family} {run['cfg'].MODEL.COMPILE_SCOPE} step {step} {name}"
