"""fast-reid checkpoint layouts as test data: read a `key shape` layout file and fill it
with seeded, plausible random values.

This module imports only torch, so the golden maker (fastreid_golden/make_golden.py) can
run it under fast-reid's own environment and the tests under ours, with identical tensors.
"""
import ast
import math
import os
import re

import torch

KEYS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastreid_keys")
GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastreid_golden")

GOLDEN_SEED = 21
GOLDEN_IMAGE_SIZE = (80, 48)  # non-square, and not a multiple of 32: ceil/floor choices show

# regnet_1600x.txt holds squeeze-excitation keys (s*.b*.f.se.*) that a RegNetX has not: fast-reid
# merges every RegNet yaml into one global config, so a RegNetX built after a RegNetY in the same
# process inherits SE_ON. In a fresh process (a user's training run) 1600x has no SE; that
# behaviour wins: the goldens are made without those keys, and WITH_SE True builds the file's
# layout.
LEAKED_KEYS = {"backbones/regnet_1600x": ".se."}


def golden_layout(name):
    """{key: shape} of layout `name` as a fresh fast-reid process builds it (LEAKED_KEYS removed)."""
    shapes = read_reference(name)
    if name in LEAKED_KEYS:
        shapes = {k: v for k, v in shapes.items() if LEAKED_KEYS[name] not in k}
    return shapes


def golden_path(name):
    """The golden file of layout `name` ("/" becomes "__")."""
    return os.path.join(GOLDEN_DIR, name.replace("/", "__") + ".json")


def backbone_options(name):
    """(NAME, DEPTH, extra {KEY: value}, LAST_STRIDE) from a backbone layout's first line."""
    match = re.match(r"fast-reid backbone (\S+) DEPTH (\S+)\s+(\{.*\}\s+)?LAST_STRIDE (\d+):",
                     read_header(name))
    extra = ast.literal_eval(match.group(3)) if match.group(3) else {}
    return match.group(1), match.group(2), extra, int(match.group(4))


def backbone_input(images):
    """The float input of the backbone goldens: roughly zero-mean, unit-scale pixels."""
    return (images.float() - 127.5) / 64.0


def layout_path(name):
    """Path of the layout file `name` (e.g. "bagtricks_R50" or "backbones/osnet_x1_0")."""
    return os.path.join(KEYS_DIR, f"{name}.txt")


def read_header(name):
    """The first line of a layout file (its '# ...' description), without the '# '."""
    with open(layout_path(name)) as handle:
        return handle.readline().lstrip("# ").strip()


def read_reference(name):
    """Parse fastreid_keys/<name>.txt into {key: shape tuple}."""
    shapes = {}
    with open(layout_path(name)) as handle:
        for line in handle:
            if line.startswith("#") or not line.strip():
                continue
            key, shape = line.strip().split(" ", 1)
            shapes[key] = tuple(ast.literal_eval(shape))
    return shapes


def random_fastreid_state(shapes, seed):
    """A state dict with the reference layout and plausible random values (seeded).

    Convolutions and linear layers are fan-in scaled so activations stay finite through
    deep trunks; norm scales lie in [0.3, 1], running variances in [0.5, 1.5].
    """
    gen = torch.Generator().manual_seed(seed)

    def uniform(shape, low, high):
        return torch.rand(shape, generator=gen) * (high - low) + low

    state = {}
    for key, shape in shapes.items():
        if key.endswith("num_batches_tracked"):
            value = torch.tensor(1000, dtype=torch.long)
        elif key.endswith("running_var"):
            value = uniform(shape, 0.5, 1.5)
        elif key.endswith("pool_layer.p"):
            value = uniform(shape, 2.5, 3.5)
        elif len(shape) == 4:  # conv: He-scaled so activations stay finite
            value = torch.randn(shape, generator=gen) * math.sqrt(1.0 / math.prod(shape[1:]))
        elif key.endswith("head.weight") or key == "heads.weight":  # classifier
            value = torch.randn(shape, generator=gen) * 0.01
        elif len(shape) == 2:  # linear layers
            value = torch.randn(shape, generator=gen) * math.sqrt(1.0 / shape[1])
        elif key.endswith("weight"):  # norm scales (including the non-local W.1)
            value = uniform(shape, 0.3, 1.0)
        elif len(shape) == 0:  # other scalars (e.g. counters)
            value = torch.tensor(1.0)
        else:  # biases, running means, tokens
            value = torch.randn(shape, generator=gen) * 0.1
        state[key] = value
    return state


def golden_images(height, width, count=2, seed=4):
    """Fixed uint8 test images (count, 3, height, width)."""
    return torch.randint(0, 256, (count, 3, height, width), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))
