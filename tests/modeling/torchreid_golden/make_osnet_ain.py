"""Write torchreid's own OSNet-AIN layouts and outputs as the golden file osnet_ain.json here.

No fast-reid layout exists for OSNet-AIN (fast-reid has none); ours follows torchreid's
osnet_ain (so its ImageNet files load). Run it where torchreid's osnet_ain module imports
(a scratch environment; torchreid is never a dependency of this project), from anywhere:

    python tests/modeling/torchreid_golden/make_osnet_ain.py [path/to/torchreid/.../osnet_ain.py]

With a path, that file is imported on its own (it needs only torch), else
``torchreid.reid.models.osnet_ain`` (torchreid-pip 0.2.x) or ``torchreid.models.osnet_ain``.
For x1_0 and x0_25 it records the trunk's state-dict layout (torchreid's keys and shapes,
without the feature fc and the classifier, which our backbone does not have); for x0_25 (the
same architecture, cheap to run in the tests) it also fills the layout with
fastreid_state.random_fastreid_state(GOLDEN_SEED) and writes the eval-mode output of
``featuremaps`` on the fixed golden images: its shape, spatial mean and channel mean.
"""
import importlib
import importlib.util
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from fastreid_state import GOLDEN_IMAGE_SIZE, GOLDEN_SEED, backbone_input, golden_images, random_fastreid_state  # noqa: E402

WIDTHS = ("x1_0", "x0_25")
OUTPUT_WIDTHS = ("x0_25",)
DROPPED = ("fc.", "classifier.")


def _osnet_ain_module(path=None):
    if path:
        spec = importlib.util.spec_from_file_location("osnet_ain", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    for name in ("torchreid.reid.models.osnet_ain", "torchreid.models.osnet_ain"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise SystemExit("torchreid's osnet_ain does not import here; pass the path of osnet_ain.py")


def main(path=None):
    module = _osnet_ain_module(path)
    golden = {}
    for width in WIDTHS:
        model = getattr(module, f"osnet_ain_{width}")(num_classes=1000, pretrained=False)
        layout = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith(DROPPED)}
        entry = golden[f"ain_{width}"] = {"layout": [[key, list(shape)] for key, shape in layout.items()]}
        if width not in OUTPUT_WIDTHS:
            continue
        model.load_state_dict(random_fastreid_state(layout, GOLDEN_SEED), strict=False)  # fc, classifier: unused
        images = backbone_input(golden_images(*GOLDEN_IMAGE_SIZE))
        with torch.no_grad():
            out = model.eval().featuremaps(images)
        entry.update(shape=list(out.shape),
                     pooled=[[float(f"{v:.7g}") for v in row] for row in out.mean((2, 3)).tolist()],
                     map=[[[float(f"{v:.7g}") for v in row] for row in plane] for plane in out.mean(1).tolist()])
    with open(os.path.join(HERE, "osnet_ain.json"), "w") as handle:
        json.dump(golden, handle, separators=(",", ":"))


if __name__ == "__main__":
    main(*sys.argv[1:2])
