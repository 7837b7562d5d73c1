"""`DefaultPredictor`: embed your own images with a trained model in a few lines."""
from typing import Any, List, Optional, Sequence

import torch

from ..config import CfgNode
from ..data import build_transforms
from ..utils.errors import UsageError
from .backends import load_exported_model, resolve_backend
from .exported_model import contract_config
from .extraction import embed_images
from .images import as_pil_image
from .model import build_inference_model, inference_config

__all__ = ["DefaultPredictor"]


class DefaultPredictor:
    """Turn images into L2-normalized ReID embeddings with the model of a config.

    The model is built from `cfg` (MODEL.BACKBONE.PRETRAIN off; a MODEL.HEADS.NUM_CLASSES
    of 0 is read from the checkpoint, since the classifier is unused at inference),
    MODEL.WEIGHTS is loaded, and the model runs in eval mode on MODEL.DEVICE. Images go
    through the test transforms (INPUT.SIZE_TEST, optional center crop); with
    TEST.FLIP.ENABLED the feature of the mirrored image is averaged in, as in evaluation.

    Example:
        cfg = get_cfg()
        cfg.merge_from_file("configs/Market1501/bagtricks_R50.yml")
        cfg.merge_from_list(["MODEL.WEIGHTS", "output/model_final.pth"])
        predictor = DefaultPredictor(cfg)
        features = predictor(["a.jpg", "b.jpg"])  # (2, D) float32, unit rows

    An exported file works too: ONNX (MODEL.WEIGHTS model.onnx, or backend="onnxruntime")
    runs with ONNX Runtime, OpenVINO IR (model.xml, or backend="openvino") with OpenVINO,
    both on the CPU. The file's preprocessing contract sets the test transforms (input
    size; flip averaging is inside the file or not at all), so the embeddings equal the
    PyTorch model's. The config then only needs MODEL.WEIGHTS:

        cfg = get_cfg(); cfg.merge_from_list(["MODEL.WEIGHTS", "exported/model.onnx"])
        features = DefaultPredictor(cfg)(["a.jpg", "b.jpg"])

    Args:
        cfg: the config (not modified).
        batch_size: images per forward pass (default: TEST.IMS_PER_BATCH).
        backend: "pytorch", "onnxruntime" or "openvino" (default: from MODEL.WEIGHTS' extension).

    Attributes:
        cfg: the frozen inference config actually used.
        backend: the back end used.
        model: the eval-mode model (an `OnnxRuntimeModel` / `OpenVinoModel` for an exported file).
        transforms: the test pipeline (PIL image -> (3, H, W) uint8 tensor).
    """

    def __init__(self, cfg: CfgNode, batch_size: Optional[int] = None, backend: Optional[str] = None):
        self.backend = resolve_backend(cfg.MODEL.WEIGHTS, backend)
        if self.backend != "pytorch":
            self.model = load_exported_model(cfg.MODEL.WEIGHTS, self.backend)
            self.cfg = contract_config(cfg, self.model.contract)
        else:
            self.cfg = inference_config(cfg)
            self.model = build_inference_model(self.cfg)
        self.transforms = build_transforms(self.cfg, is_train=False)
        self.batch_size = int(batch_size or self.cfg.TEST.IMS_PER_BATCH)
        if self.batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {self.batch_size} (TEST.IMS_PER_BATCH): pass a positive size")
        self.flip = bool(self.cfg.TEST.FLIP.ENABLED)

    @property
    def device(self) -> torch.device:
        """The device the model runs on."""
        return self.model.device

    def preprocess(self, image: Any) -> torch.Tensor:
        """Apply the test transforms to one image.

        Args:
            image: a path, a Pillow image, or an (H, W, 3) uint8 RGB array.
        Returns:
            (3, H, W) uint8 tensor of INPUT.SIZE_TEST (or the crop size).
        """
        # Files are decoded at full resolution (no JPEG draft mode), so a path gives
        # exactly the embedding of the same image passed as a PIL image or an array.
        return self.transforms(as_pil_image(image))

    def __call__(self, images: Any) -> torch.Tensor:
        """Embed one image or a list of images.

        Args:
            images: one image, or a list / tuple of images; each a file path, a Pillow
                image, or an (H, W, 3) uint8 RGB numpy array.
        Returns:
            (N, D) float32 CPU tensor of L2-normalized embeddings (N = 1 for one image),
            rows in input order.
        """
        batch: Sequence[Any] = images if isinstance(images, (list, tuple)) else [images]
        if len(batch) == 0:
            raise UsageError("no image given: pass an image or a non-empty list of images")
        chunks: List[torch.Tensor] = []
        for start in range(0, len(batch), self.batch_size):
            tensors = [self.preprocess(img) for img in batch[start:start + self.batch_size]]
            chunks.append(self.embed_batch(torch.stack(tensors)))
        return torch.cat(chunks)

    def embed_batch(self, images: torch.Tensor) -> torch.Tensor:
        """Embed a batch that already went through the test transforms.

        Args:
            images: (B, 3, H, W) uint8 (or float 0..255) tensor, on any device.
        Returns:
            (B, D) float32 CPU tensor of L2-normalized embeddings.
        """
        return embed_images(self.model, images, flip=self.flip)
