"""VideoBaseline: temporal pooling by hand, image batches unchanged, and tracklet evaluation against hand-computed metrics."""

import pytest
import torch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.evaluation import inference_on_dataset
from reid_engine.evaluation.reid_evaluation import ReidEvaluator
from reid_engine.modeling import build_model
from reid_engine.modeling.heads.embedding_head import EmbeddingHead
from reid_engine.modeling.layers import TemporalPool
from reid_engine.modeling.meta_arch import VideoBaseline
from reid_engine.utils.errors import ReidUserError

from ._helpers import tiny_cfg


class PixelBackbone(nn.Module):
    """The normalised image itself as the feature map (3 channels)."""

    out_channels = 3

    def forward(self, images):
        return images


def _pixel_model(pool: str) -> VideoBaseline:
    head = EmbeddingHead(in_channels=3, num_classes=2)
    return VideoBaseline(backbone=PixelBackbone(), heads=head, pixel_mean=[0.0] * 3, pixel_std=[1.0] * 3,
                         temporal_pool=TemporalPool(pool, 3)).eval()


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_temporal_pool_equals_hand_computation(pool):
    torch.manual_seed(0)
    tracklets = torch.rand(2, 3, 3, 4, 2) * 255  # B=2, T=3 frames of 3 x 4 x 2
    with torch.no_grad():
        features = _pixel_model(pool)(tracklets)
    over_time = tracklets.mean(1) if pool == "avg" else tracklets.amax(1)
    torch.testing.assert_close(features, over_time.mean(dim=(2, 3)))


def test_attention_pool_weights_sum_to_one():
    pool = TemporalPool("attention", 3)
    maps = torch.ones(2, 4, 3, 2, 2)
    torch.testing.assert_close(pool(maps), torch.ones(2, 3, 2, 2))
    assert [name for name, _ in pool.named_parameters()] == ["attention.weight", "attention.bias"]
    with pytest.raises(ReidUserError, match="MODEL.HEADS.TEMPORAL_POOL"):
        TemporalPool("mean", 3)


def test_image_batches_keep_baseline_behaviour():
    torch.manual_seed(0)
    cfg = tiny_cfg(META_ARCHITECTURE="VideoBaseline")
    cfg.MODEL.BACKBONE.PRETRAIN = False
    video = build_model(cfg).eval()
    cfg.MODEL.META_ARCHITECTURE = "Baseline"
    image = build_model(cfg).eval()
    assert set(video.state_dict()) == set(image.state_dict())  # avg pooling adds no parameters
    image.load_state_dict(video.state_dict())
    images = torch.randint(0, 256, (2, 3, 64, 32), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(video(images), image(images), rtol=0, atol=0)
        # one-frame tracklets give the image features
        torch.testing.assert_close(video(images[:, None]), image(images), rtol=1e-5, atol=1e-5)
    video.train()
    losses = video({"images": images[:, None].expand(2, 3, 3, 64, 32), "targets": torch.tensor([0, 1])})
    assert losses and all(torch.isfinite(v) for v in losses.values())


def _tracklet(value: float, frames: int = 2) -> torch.Tensor:
    """A tracklet whose frames average to ``value`` everywhere: value -+ 0.05."""
    offsets = torch.linspace(-0.05, 0.05, frames)
    return (value + offsets)[:, None, None, None].expand(frames, 3, 2, 2)


def test_tracklet_evaluation_matches_hand_computed_metrics():
    cfg = get_cfg()
    cfg.TEST.METRIC = "euclidean"
    # (value, pid, camid); feature = value in every channel, distance ~ |difference|
    query = [(0.0, 1, 0), (0.22, 2, 0)]
    gallery = [(0.1, 1, 0),   # same id, same camera: junk for query 0
               (0.2, 2, 1),
               (0.3, 1, 1),
               (0.05, 0, 1),  # a distractor (pid 0): always a negative
               (0.9, 1, 2)]
    items = query + gallery
    batches = [{"images": torch.stack([_tracklet(v, frames) for v, _, _ in chunk]),
                "targets": torch.tensor([p for _, p, _ in chunk]), "camids": torch.tensor([c for _, _, c in chunk])}
               for chunk, frames in ((items[:3], 2), (items[3:], 3))]  # batches of different T
    results = inference_on_dataset(_pixel_model("avg"), batches, ReidEvaluator(cfg, num_query=len(query)))
    # query 0 ranks (junk g0 dropped): g3 -, g1 -, g2 +, g4 +: first match at rank 3,
    #   AP = (1/3 + 2/4) / 2, INP = 2 / 4; query 1: g1 + first: AP = INP = 1.
    assert results["Rank-1"] == pytest.approx(50.0)
    assert results["Rank-5"] == pytest.approx(100.0)
    assert results["mAP"] == pytest.approx(((1 / 3 + 2 / 4) / 2 + 1) / 2 * 100)
    assert results["mINP"] == pytest.approx((0.5 + 1) / 2 * 100)


def test_plain_baseline_names_videobaseline_for_tracklets():
    from reid_engine.config import ConfigError
    from reid_engine.modeling.meta_arch import Baseline

    from ._helpers import tiny_cfg

    model = Baseline.from_config(tiny_cfg()).eval()
    with pytest.raises(ConfigError, match="need MODEL.META_ARCHITECTURE VideoBaseline"):
        model({"images": torch.zeros(2, 4, 3, 64, 32, dtype=torch.uint8)})
