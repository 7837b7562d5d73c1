"""An independent, functional transcription of fast-reid's test-time forward (Baseline with a
ResNet trunk and EmbeddingHead), computed straight from a state dict with torch.nn.functional.

It shares no code with reid_engine, so a test that compares the two pins down the facts fast-reid
users rely on (fast-reid 1.4, fastreid/modeling/backbones/resnet.py, layers/, heads/):
- inputs are (x - PIXEL_MEAN) / PIXEL_STD on the 0..255 scale;
- the stem is conv 7x7 / 2 (padding 3), BN, ReLU, max-pool kernel 3, stride 2, padding 0,
  ceil_mode True;
- bottlenecks carry the stride in conv2; IBN-a replaces bn1 in every block of layer1-3
  (InstanceNorm with affine on the first half of the channels, BN on the rest; not layer4);
- non-local blocks (1 intermediate channel, f / N, W = conv + BN, residual) follow the last
  blocks of layer2 / layer3;
- pooling: average, GeM with p = 3 (clamp at 1e-6), or GeM with the stored `pool_layer.p`;
- eval returns the BN-neck output (`heads.bottleneck`), whatever MODEL.HEADS.NECK_FEAT says.
"""
import torch
import torch.nn.functional as F

PIXEL_MEAN = torch.tensor([0.485 * 255, 0.456 * 255, 0.406 * 255]).view(1, 3, 1, 1)
PIXEL_STD = torch.tensor([0.229 * 255, 0.224 * 255, 0.225 * 255]).view(1, 3, 1, 1)
BLOCKS_R50 = (3, 4, 6, 3)
NON_LOCAL_R50 = (0, 2, 3, 0)


def _bn(x, s, prefix):
    return F.batch_norm(x, s[prefix + ".running_mean"], s[prefix + ".running_var"],
                        s[prefix + ".weight"], s[prefix + ".bias"], training=False, eps=1e-5)


def _conv(x, s, prefix, stride=1, padding=0):
    return F.conv2d(x, s[prefix + ".weight"], s.get(prefix + ".bias"), stride=stride, padding=padding)


def _ibn(x, s, prefix):
    half = s[prefix + ".IN.weight"].numel()
    a, b = x[:, :half], x[:, half:]
    a = F.instance_norm(a, weight=s[prefix + ".IN.weight"], bias=s[prefix + ".IN.bias"], eps=1e-5)
    return torch.cat([a, _bn(b, s, prefix + ".BN")], 1)


def _bottleneck(x, s, prefix, stride):
    out = _conv(x, s, prefix + ".conv1")
    out = _ibn(out, s, prefix + ".bn1") if prefix + ".bn1.IN.weight" in s else _bn(out, s, prefix + ".bn1")
    out = F.relu(out)
    out = F.relu(_bn(_conv(out, s, prefix + ".conv2", stride=stride, padding=1), s, prefix + ".bn2"))
    out = _bn(_conv(out, s, prefix + ".conv3"), s, prefix + ".bn3")
    shortcut = x
    if prefix + ".downsample.0.weight" in s:
        shortcut = _bn(_conv(x, s, prefix + ".downsample.0", stride=stride), s, prefix + ".downsample.1")
    return F.relu(out + shortcut)


def _non_local(x, s, prefix):
    b, _, h, w = x.shape
    g = _conv(x, s, prefix + ".g").view(b, -1, h * w).permute(0, 2, 1)
    theta = _conv(x, s, prefix + ".theta").view(b, -1, h * w).permute(0, 2, 1)
    phi = _conv(x, s, prefix + ".phi").view(b, -1, h * w)
    f = torch.matmul(theta, phi)
    y = torch.matmul(f / f.shape[-1], g).permute(0, 2, 1).reshape(b, -1, h, w)
    return _bn(_conv(y, s, prefix + ".W.0"), s, prefix + ".W.1") + x


def _pool(x, s, pool_layer):
    if pool_layer == "GlobalAvgPool":
        return F.adaptive_avg_pool2d(x, 1)
    p = s["heads.pool_layer.p"] if pool_layer == "GeneralizedMeanPoolingP" else 3.0
    return F.adaptive_avg_pool2d(x.clamp(min=1e-6).pow(p), 1).pow(1.0 / p)


def fastreid_resnet50_embeddings(state, images_uint8, last_stride=1, pool_layer="GlobalAvgPool"):
    """Test-time embeddings of a fast-reid ResNet-50 Baseline checkpoint.

    Args:
        state: the checkpoint's "model" dict (fast-reid key layout).
        images_uint8: (B, 3, H, W) uint8 RGB.
        last_stride: MODEL.BACKBONE.LAST_STRIDE.
        pool_layer: "GlobalAvgPool", "GeneralizedMeanPooling" or "GeneralizedMeanPoolingP".
    Returns:
        (B, 2048) float32: the BN-neck output.
    """
    s = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    s = {k[len("backbone."):] if k.startswith("backbone.") else k: v for k, v in s.items()}
    x = (images_uint8.float() - PIXEL_MEAN) / PIXEL_STD
    x = F.relu(_bn(_conv(x, s, "conv1", stride=2, padding=3), s, "bn1"))
    x = F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)
    for stage, (count, stride) in enumerate(zip(BLOCKS_R50, (1, 2, 2, last_stride)), start=1):
        has_nl = f"NL_{stage}.0.g.weight" in s
        first_nl = count - NON_LOCAL_R50[stage - 1] if has_nl else count
        for i in range(count):
            x = _bottleneck(x, s, f"layer{stage}.{i}", stride if i == 0 else 1)
            if i >= first_nl:
                x = _non_local(x, s, f"NL_{stage}.{i - first_nl}")
    pooled = _pool(x, s, pool_layer)
    return _bn(pooled, s, "heads.bottleneck.0")[..., 0, 0]
