"""The shipped config families, one table for the compile benchmark (bench_compile_time.py) and the
GPU acceptance run (tools/gpu_acceptance.py): a representative config of each, and what each kind
of run changes in it."""
import dataclasses
from typing import Sequence

__all__ = ["Family", "FAMILIES", "BOT", "RESNET_TINY"]

M = "configs/Market1501/"
# Quarter-width ResNet-18 without non-local blocks (defined for 50x / 101x only).
RESNET_TINY = ("MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.WIDTH_MULT", "0.25", "MODEL.BACKBONE.WITH_NL", "False")


@dataclasses.dataclass(frozen=True)
class Family:
    """One shipped config family: its config (relative to the repository) and its overrides."""

    name: str
    config: str
    extra: Sequence[str] = ()  # overrides of a full-size run
    tiny: Sequence[str] = ()  # overrides of a tiny CPU run (after the common tiny ones)
    epochs: int = 1  # of an acceptance run
    video: bool = False  # trains on tracklets
    teacher: bool = False  # needs KD teacher files (gpu_acceptance.py --write-teacher writes one)


# Most telling first: the BoT baseline; sbs_R50 (its freeze release recompiles; under whole-model
# compilation it did not finish in 5 minutes, so its release comes at iteration 30, inside the
# acceptance run's epoch), ViT (attention blocks), AGW (non-local blocks), MGN (branches); then the
# other backbones and meta-architectures.
FAMILIES = (
    Family("bagtricks_R50", M + "bagtricks_R50.yml", tiny=RESNET_TINY),
    Family("sbs_R50", M + "sbs_R50.yml", extra=("SOLVER.FREEZE_ITERS", "30"),
           tiny=RESNET_TINY + ("SOLVER.FREEZE_ITERS", "3")),
    Family("bagtricks_vit", M + "bagtricks_vit.yml", tiny=("MODEL.BACKBONE.DEPTH", "small")),
    Family("AGW_R50", M + "AGW_R50.yml", tiny=RESNET_TINY),
    Family("mgn_R50-ibn", M + "mgn_R50-ibn.yml",  # 96 rows: b3's map keeps enough rows for its stripes
           tiny=RESNET_TINY + ("INPUT.SIZE_TRAIN", "[96, 32]", "INPUT.SIZE_TEST", "[96, 32]")),
    Family("bagtricks_R50-ibn", M + "bagtricks_R50-ibn.yml", tiny=RESNET_TINY),
    Family("bagtricks_R50_moco", M + "bagtricks_R50_moco.yml", tiny=RESNET_TINY + ("MODEL.QUEUE_SIZE", "64")),
    Family("bagtricks_osnet_x1_0", M + "bagtricks_osnet_x1_0.yml", tiny=("MODEL.BACKBONE.DEPTH", "x0_25")),
    Family("bagtricks_mobilenetv3_Large", M + "bagtricks_mobilenetv3_Large.yml", tiny=("MODEL.BACKBONE.DEPTH", "Small")),
    Family("bagtricks_S50", M + "bagtricks_S50.yml"),  # ResNeSt starts at 50x: tiny only by its input
    Family("kd-sbs_R101-ibn-sbs_R34", M + "kd-sbs_R101-ibn-sbs_R34.yml", tiny=RESNET_TINY, teacher=True),
    Family("mars", "configs/MARS/bagtricks_R50.yml", extra=("SOLVER.IMS_PER_BATCH", "16"), epochs=3, video=True,
           tiny=RESNET_TINY + ("INPUT.SEQ_LEN", "2", "DATALOADER.NUM_INSTANCE", "2", "SOLVER.IMS_PER_BATCH", "8",
                               "TEST.IMS_PER_BATCH", "16")),
    Family("kd-ema_sbs_R34", M + "kd-ema_sbs_R34.yml", tiny=RESNET_TINY),  # self-distillation: no teacher files
)
#: the BoT baseline: the acceptance run's bot_* parts (its family row)
BOT = FAMILIES[0]
