"""EmbeddingHead: pooling, optional 1x1 embedding, BN neck and the classifier."""
from typing import Dict, Optional, Union

import torch
from torch import nn
from torch.nn import functional as F

from reid_engine.config import ConfigError
from reid_engine.utils.registry import check_choice

from ..layers import CLS_LAYER_REGISTRY, NORM_NAMES, POOLING_REGISTRY, build_cls_layer, build_pooling, get_norm
from .build import HEADS_REGISTRY

__all__ = ["EmbeddingHead"]

#: accepted MODEL.HEADS.NECK_FEAT values
NECK_FEATS = ("before", "after")


@HEADS_REGISTRY.register()
class EmbeddingHead(nn.Module):
    """Pool the backbone map, pass it through the neck and classify it.

    Sub-modules (fast-reid's state-dict layout): `pool_layer`, `bottleneck` (a
    Sequential of the optional 1x1 embedding conv and the optional BN neck, whose bias
    is frozen), `cls_layer` (no parameters) and the parameter `weight`
    (num_classes x D, the class centres, no bias).

    Two features are chosen separately, as in fast-reid:
    - the training feature (MODEL.HEADS.NECK_FEAT), the "features" output that the
      metric losses get: "before" = the pooled feature, before the whole neck;
      "after" = the neck's output;
    - the test feature (TEST.NECK_FEAT), what eval mode returns: "after" = the neck's
      output (fast-reid always tests with it; it is the pooled or embedded feature
      itself when there is no BN neck); "before" = the feature entering the BN neck,
      i.e. the embedded feature, or the pooled one without an embedding conv.

    Args:
        in_channels: channels of the backbone map (the backbone's `out_channels`).
        num_classes: number of training identities (> 0).
        embedding_dim: output channels of the 1x1 embedding conv; 0 = none.
        with_bnneck: add the BN neck.
        norm: norm name of the neck.
        neck_feat: training feature, "before" or "after".
        test_feat: test feature, "after" (fast-reid) or "before".
        pool_layer: pooling layer name.
        cls_layer: classifier layer name.
        scale, margin: classifier layer parameters.
    """

    def __init__(self, *, in_channels: int, num_classes: int, embedding_dim: int = 0,
                 with_bnneck: bool = False, norm: str = "BN", neck_feat: str = "before",
                 test_feat: str = "after", pool_layer: str = "GlobalAvgPool", cls_layer: str = "Linear",
                 scale: float = 1.0, margin: float = 0.0):
        super().__init__()
        if num_classes <= 0:
            raise ConfigError("MODEL.HEADS.NUM_CLASSES is 0: it is filled from the training set "
                              "by the trainer; set it for standalone use")
        check_choice(neck_feat, NECK_FEATS, "MODEL.HEADS.NECK_FEAT")
        check_choice(test_feat, NECK_FEATS, "TEST.NECK_FEAT")
        self.in_feat_dim = in_channels
        self.neck_feat = neck_feat
        self.test_feat = test_feat
        self.with_bnneck = with_bnneck
        self.pool_name = pool_layer
        self.pool_layer = build_pooling(pool_layer)
        neck, out_dim = [], in_channels
        if embedding_dim > 0:
            neck.append(nn.Conv2d(in_channels, embedding_dim, kernel_size=1, bias=False))
            out_dim = embedding_dim
        if with_bnneck:
            neck.append(get_norm(norm, out_dim, bias_freeze=True, key="MODEL.HEADS.NORM"))
        self.bottleneck = nn.Sequential(*neck)
        self.cls_layer = build_cls_layer(cls_layer, num_classes, scale, margin)
        self.weight = nn.Parameter(torch.empty(num_classes, out_dim))
        # Width of the test feature (both test choices come after the embedding conv).
        self.feat_dim = out_dim
        self.reset_parameters()

    @staticmethod
    def check_config(cfg) -> None:
        """Check the enumerated MODEL.HEADS values (NECK_FEAT, POOL_LAYER, CLS_LAYER, NORM) and TEST.NECK_FEAT."""
        heads = cfg.MODEL.HEADS
        check_choice(heads.NECK_FEAT, NECK_FEATS, "MODEL.HEADS.NECK_FEAT")
        check_choice(cfg.TEST.NECK_FEAT, NECK_FEATS, "TEST.NECK_FEAT")
        POOLING_REGISTRY.get(heads.POOL_LAYER)
        CLS_LAYER_REGISTRY.get(heads.CLS_LAYER)
        check_choice(heads.NORM, NORM_NAMES, "MODEL.HEADS.NORM")

    @classmethod
    def from_config(cls, cfg, in_channels: int) -> "EmbeddingHead":
        """Build from MODEL.HEADS.* and TEST.NECK_FEAT for a backbone map of `in_channels` channels."""
        heads = cfg.MODEL.HEADS
        return cls(in_channels=in_channels, num_classes=heads.NUM_CLASSES,
                   embedding_dim=heads.EMBEDDING_DIM, with_bnneck=heads.WITH_BNNECK,
                   norm=heads.NORM, neck_feat=heads.NECK_FEAT, test_feat=cfg.TEST.NECK_FEAT,
                   pool_layer=heads.POOL_LAYER,
                   cls_layer=heads.CLS_LAYER, scale=heads.SCALE, margin=heads.MARGIN)

    def reset_parameters(self) -> None:
        """Kaiming embedding conv, neck weight 1 / bias 0, class centres N(0, 0.01^2)."""
        for module in self.bottleneck:
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(getattr(module, "weight", None), torch.Tensor):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.weight, std=0.01)

    def _pool(self, features: torch.Tensor) -> torch.Tensor:
        pooled = self.pool_layer(features)
        if pooled.dim() != 4 or pooled.shape[-2:] != (1, 1):
            raise ConfigError(f"MODEL.HEADS.POOL_LAYER {self.pool_name!r} left a map of shape "
                              f"{tuple(pooled.shape)}; use a global pooling layer (e.g. GlobalAvgPool)")
        if pooled.shape[1] != self.in_feat_dim:
            raise ConfigError(f"the pooled feature has {pooled.shape[1]} channels but the head "
                              f"was built for {self.in_feat_dim}; set MODEL.HEADS.POOL_LAYER to a "
                              f"layer that keeps the backbone's channels (e.g. GlobalAvgPool)")
        return pooled

    def _test_feature(self, pooled: torch.Tensor) -> torch.Tensor:
        """The neck's output ("after"), or the input of its BN layer ("before")."""
        if self.test_feat == "after" or not self.with_bnneck:
            return self.bottleneck(pooled)
        return self.bottleneck[:-1](pooled)

    def forward(self, features: torch.Tensor, targets: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Run the head.

        Args:
            features: backbone map (B, C, h, w).
            targets: (B,) int64 class ids; required in training mode.

        Returns:
            eval: the test feature (B, D). training: {"cls_outputs": logits after
            margin and scale, "pred_class_logits": logits without margin, times scale,
            "features": the training feature}.
        """
        pooled = self._pool(features)
        if not self.training:
            return self._test_feature(pooled)[..., 0, 0]
        neck = self.bottleneck(pooled)[..., 0, 0]
        selected = pooled[..., 0, 0] if self.neck_feat == "before" else neck
        if targets is None:
            raise ValueError("EmbeddingHead in training mode needs targets; call "
                             "model.eval() for features")
        logits = self._logits(neck)
        return {
            "cls_outputs": self.cls_layer(logits, targets),
            "pred_class_logits": logits * self.cls_layer.s,
            "features": selected,
        }

    def _logits(self, neck: torch.Tensor) -> torch.Tensor:
        """Class logits of the neck feature, before margin and scale (cosine for cosine classifiers)."""
        if self.cls_layer.uses_cosine:
            return F.linear(F.normalize(neck), F.normalize(self.weight))
        return F.linear(neck, self.weight)

    def class_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The "pred_class_logits" of a backbone map in either mode (no targets, no margin).

        A distillation teacher runs in eval mode, where forward returns features only;
        this gives its logits (the BN neck then uses its running statistics).

        Args:
            features: backbone map (B, C, h, w).
        Returns:
            (B, num_classes) logits times the classifier's scale.
        """
        neck = self.bottleneck(self._pool(features))[..., 0, 0]
        return self._logits(neck) * self.cls_layer.s
