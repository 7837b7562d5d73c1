"""Meta architectures: registry, `build_model`, Baseline, ClusterContrast, Distiller, MGN, MoCo, TransReID and VideoBaseline."""
from .baseline import Baseline
from .build import CHANNELS_LAST_CHOICES, META_ARCH_REGISTRY, build_model, use_channels_last
from .cluster_contrast import ClusterContrast
from .distiller import Distiller
from .mgn import MGN
from .moco import MoCo
from .summary import count_flops, count_parameters, log_model_summary
from .transreid import TransReID
from .video_baseline import VideoBaseline

__all__ = ["META_ARCH_REGISTRY", "build_model", "Baseline", "ClusterContrast",
           "Distiller", "MGN", "MoCo", "TransReID", "VideoBaseline",
           "count_flops", "count_parameters", "log_model_summary", "use_channels_last", "CHANNELS_LAST_CHOICES"]
