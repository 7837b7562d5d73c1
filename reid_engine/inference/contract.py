"""The preprocessing contract an exported model carries: what its input must be, what its output is.

One `DeployContract` describes an exported feature module (input size, resize
interpolation, channel order, input dtype and value range, the feature dimension,
whether the features are L2-normalized, where the model came from). The exporters write
it into the file (ONNX `metadata_props`, one string entry per field; OpenVINO IR the same
entries in the rt_info section `reid_engine`; TorchScript an extra file
`reid_engine_contract.json`), `read_contract` reads it back from any of them, and the
exported-model back ends configure their preprocessing from it (`configure`), so that a
deployed model is fed exactly what the test transforms feed the PyTorch model.
"""
import dataclasses
import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple
from xml.etree import ElementTree

from .. import __version__
from ..config import CfgNode
from ..data import build_transforms
from ..utils.errors import ReidUserError
from .ort_session import onnx_session

__all__ = ["CONTRACT_FILE", "RT_INFO_SECTION", "CONTRACT_VERSION", "NORMALIZATIONS", "DeployContract", "ContractError",
           "contract_from_config", "file_sha256", "pixel_stats_text", "read_contract", "transform_sizes"]

#: the extra file of a TorchScript archive that holds the contract (JSON)
CONTRACT_FILE = "reid_engine_contract.json"
#: the section of an OpenVINO IR file's rt_info that holds the contract (one entry per field)
RT_INFO_SECTION = "reid_engine"

#: the contract_version this reid_engine writes (2: mean / std, normalization and checksum entries)
CONTRACT_VERSION = 2
#: where the mean / std normalization happens: in the graph, or in the client
NORMALIZATIONS = ("inside", "outside")
#: the input the test transforms (and so reid_engine's back ends) produce: raw values, not normalized
_FED_VALUE_RANGE = "0..255"

_TRUE, _FALSE = "true", "false"


class ContractError(ReidUserError, ValueError):
    """A model file without a (readable) reid_engine preprocessing contract."""


@dataclass(frozen=True)
class DeployContract:
    """What an exported ReID model expects and returns.

    The input is a (B, 3, input_height, input_width) batch in `channel_order`, made by
    resizing each image to resize_height x resize_width with `interpolation` (Pillow's
    filter of that name) from the image decoded at full size, then center-cropping to the
    input size when it is smaller, with values `value_range` stored as `input_dtype`.
    `normalization` says who applies (x - pixel_mean) / pixel_std (comma-separated, one
    value per channel in `channel_order`, in the units of `value_range`): "inside" the
    graph (feed the values as they are) or "outside" (the client must). The output is
    (B, feature_dim) float32, L2-normalized when `normalized_features`; with
    `flip_averaged` the mirrored image's features are averaged in inside the model.
    The source is named by file name and `source_checkpoint_sha256` (the sha256 of the
    checkpoint file, as `sha256sum` prints it), not by local paths.

    Version 1 files (no mean / std, normalization or checksum entries) still read: their
    normalization was always inside, and the mean / std are then unknown ("").
    """

    input_height: int
    input_width: int
    resize_height: int
    resize_width: int
    feature_dim: int
    input_dtype: str = "uint8"
    normalized_features: bool = True
    flip_averaged: bool = False
    interpolation: str = "bicubic"
    channel_order: str = "RGB"
    layout: str = "NCHW"
    value_range: str = "0..255"
    normalization: str = "inside"
    pixel_mean: str = ""
    pixel_std: str = ""
    input_name: str = "images"
    output_name: str = "features"
    quantization: str = "none"
    meta_architecture: str = ""
    backbone: str = ""
    source_config: str = ""
    source_checkpoint: str = ""
    source_checkpoint_sha256: str = ""
    reid_engine_version: str = __version__
    contract_version: int = CONTRACT_VERSION

    def to_dict(self) -> Dict[str, str]:
        """Every field as a string (ONNX metadata values are strings; booleans "true" / "false")."""
        return {f.name: _to_text(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, str], source: str = "the model file") -> "DeployContract":
        """Parse what `to_dict` wrote (unknown keys, e.g. other tools' metadata, are ignored).

        Args:
            values: the string entries (ONNX metadata_props, or the TorchScript JSON).
            source: the file, for error messages.
        Raises:
            ContractError: required entries are missing or unreadable.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
        missing = [n for n in required if n not in values]
        if missing:
            raise ContractError(f"{source} carries no reid_engine preprocessing contract (missing {', '.join(missing)}): "
                                "export it with reid-export, which writes one")
        parsed = {}
        for name, value in values.items():
            if name in fields:
                try:
                    parsed[name] = _from_text(str(value), fields[name].type)
                except ValueError:
                    raise ContractError(f"{source}: contract entry {name}={value!r} is not a valid "
                                        f"{fields[name].type}; re-export the model with reid-export") from None
        if parsed.get("normalization", "inside") not in NORMALIZATIONS:
            raise ContractError(f"{source}: contract entry normalization={parsed['normalization']!r} is not one of "
                                f"{', '.join(NORMALIZATIONS)}; re-export the model with reid-export")
        return cls(**parsed)

    def to_json(self) -> str:
        """The contract as a JSON object of strings (the TorchScript extra file)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text, source: str = "the model file") -> "DeployContract":
        """Parse what `to_json` wrote (str or bytes)."""
        try:
            values = json.loads(text)
        except ValueError:
            raise ContractError(f"{source}: the contract is not valid JSON; re-export the model with reid-export") from None
        return cls.from_dict(values, source=source)

    def replace(self, **changes) -> "DeployContract":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def pixel_stats(self) -> Optional[Tuple[Tuple[float, ...], Tuple[float, ...]]]:
        """(mean, std) per channel as floats, or None when not recorded (version 1 files).

        Raises:
            ContractError: the entries are not comma-separated numbers, one per channel.
        """
        if not self.pixel_mean and not self.pixel_std:
            return None
        try:
            mean = tuple(float(v) for v in self.pixel_mean.split(","))
            std = tuple(float(v) for v in self.pixel_std.split(","))
        except ValueError:
            mean = std = ()
        if len(mean) != 3 or len(std) != 3:
            raise ContractError(f"contract entries pixel_mean={self.pixel_mean!r} / pixel_std={self.pixel_std!r} "
                                "are not 3 comma-separated numbers each; re-export the model with reid-export")
        return mean, std

    def describe(self) -> str:
        """Human-readable lines: the preprocessing recipe, the output, then every field."""
        crop = (f", center-crop to {self.input_height}x{self.input_width}"
                if (self.resize_height, self.resize_width) != (self.input_height, self.input_width) else "")
        kind = "L2-normalized" if self.normalized_features else "raw (not normalized)"
        stats = (f"mean {self.pixel_mean}, std {self.pixel_std} ({self.channel_order}, units of {self.value_range})"
                 if self.pixel_stats() is not None else f"mean / std not recorded (contract version {self.contract_version})")
        where = ("inside the graph: feed the values unnormalized" if self.normalization == "inside"
                 else "outside the graph: the client computes (x - mean) / std before feeding")
        lines = [
            f"input  {self.input_name}: ({self.layout}) B x 3 x {self.input_height} x {self.input_width}, "
            f"{self.channel_order}, {self.input_dtype} values {self.value_range}",
            f"       mean/std normalization {where}; {stats}",
            f"       decode at full size, resize to {self.resize_height}x{self.resize_width} (height x width) "
            f"with {self.interpolation} interpolation{crop}",
            f"output {self.output_name}: B x {self.feature_dim} float32, {kind}"
            + (", flip-averaged inside" if self.flip_averaged else ""),
        ]
        return "\n".join(lines + [f"{k}: {v or '-'}" for k, v in self.to_dict().items()])

    def configure(self, cfg: CfgNode) -> CfgNode:
        """A frozen copy of `cfg` whose test transforms produce this contract's input.

        INPUT.SIZE_TEST / INPUT.CROP come from the contract; TEST.FLIP.ENABLED is switched
        off, since the file already does (or does not do) flip averaging itself.
        Raises:
            ContractError: an input the test transforms (raw 0..255 bicubic RGB NCHW, normalized
                inside the graph) do not produce, e.g. a file normalized outside for BoxMOT.
        """
        if self.interpolation != "bicubic" or self.channel_order != "RGB" or self.layout != "NCHW":
            raise ContractError(f"the model expects {self.interpolation} / {self.channel_order} / {self.layout} "
                                "input, but reid_engine's test transforms give bicubic / RGB / NCHW; "
                                "re-export the model with reid-export")
        if self.normalization != "inside" or self.value_range != _FED_VALUE_RANGE:
            raise ContractError(f"the model expects {self.value_range} input normalized {self.normalization} the graph "
                                f"(a file for other tools, e.g. BoxMOT), but reid_engine's back ends feed raw "
                                f"{_FED_VALUE_RANGE} values: use the plain reid-export file (or the .pth checkpoint)")
        cfg = cfg.clone()
        cfg.defrost()
        cfg.INPUT.SIZE_TEST = [self.resize_height, self.resize_width]
        cfg.INPUT.CROP.ENABLED = (self.resize_height, self.resize_width) != (self.input_height, self.input_width)
        if cfg.INPUT.CROP.ENABLED:
            cfg.INPUT.CROP.SIZE = [self.input_height, self.input_width]
        cfg.TEST.FLIP.ENABLED = False
        cfg.freeze()
        return cfg


def transform_sizes(cfg: CfgNode) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """((resize height, width), (input height, width)) of the test transforms of `cfg`."""
    resize = (int(cfg.INPUT.SIZE_TEST[0]), int(cfg.INPUT.SIZE_TEST[1]))
    probe = build_transforms(cfg, is_train=False)(_probe_image())
    return resize, (int(probe.shape[1]), int(probe.shape[2]))


def _probe_image():
    from PIL import Image

    return Image.new("RGB", (64, 128))


def contract_from_config(cfg: CfgNode, feature_dim: int, input_dtype: str = "uint8", normalize: bool = True,
                         source_config: str = "") -> DeployContract:
    """The contract of the feature module exported from `cfg`.

    Args:
        cfg: the inference config (INPUT.*, TEST.FLIP, MODEL.*).
        feature_dim: D of the (B, D) output.
        input_dtype: "uint8" or "float32".
        normalize: the features are L2-normalized.
        source_config: the config file the model was built from ("" when unknown); only its
            file name is recorded (local paths mean nothing where the file is deployed).
    """
    resize, size = transform_sizes(cfg)
    backbone = cfg.MODEL.BACKBONE.NAME + (f" depth={cfg.MODEL.BACKBONE.DEPTH}" if cfg.MODEL.BACKBONE.DEPTH else "")
    weights = cfg.MODEL.WEIGHTS or ""
    # The graph normalizes 0..255 input with the model's buffers, which come from these keys.
    mean, std = pixel_stats_text(cfg.MODEL.PIXEL_MEAN), pixel_stats_text(cfg.MODEL.PIXEL_STD)
    return DeployContract(input_height=size[0], input_width=size[1], resize_height=resize[0], resize_width=resize[1],
                          feature_dim=int(feature_dim), input_dtype=input_dtype, normalized_features=bool(normalize),
                          flip_averaged=bool(cfg.TEST.FLIP.ENABLED), meta_architecture=cfg.MODEL.META_ARCHITECTURE,
                          backbone=backbone, normalization="inside", pixel_mean=mean, pixel_std=std,
                          source_config=os.path.basename(source_config), source_checkpoint=os.path.basename(weights),
                          source_checkpoint_sha256=file_sha256(weights) if os.path.isfile(weights) else "")


def pixel_stats_text(values) -> str:
    """Per-channel mean or std as a contract entry: comma-separated floats (`DeployContract.pixel_stats` reads it)."""
    return ",".join(repr(float(v)) for v in values)


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes as 64 hex digits (what `sha256sum` prints), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_contract(path: str) -> DeployContract:
    """Read the contract of an exported ONNX, OpenVINO IR or TorchScript file (nothing in it is executed).

    Args:
        path: a .onnx file, an OpenVINO IR .xml file, or a TorchScript archive.
    Raises:
        ContractError: the file has no contract, or is neither format.
    """
    if not os.path.isfile(path):
        raise ContractError(f"{path} is not a file: pass an exported model (.onnx, OpenVINO .xml or TorchScript .pt)")
    if path.lower().endswith(".xml"):
        return _read_openvino_contract(path)
    if zipfile.is_zipfile(path):  # TorchScript archives are zip files
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/extra/" + CONTRACT_FILE)]
            if not names:
                raise ContractError(f"{path} carries no reid_engine preprocessing contract (no extra file "
                                    f"{CONTRACT_FILE}): export it with reid-export, which writes one")
            return DeployContract.from_json(archive.read(names[0]), source=path)
    try:
        import onnx
    except ImportError:  # onnxruntime alone reads the metadata too (it builds a session)
        return DeployContract.from_dict(onnx_session(path, threads=1).get_modelmeta().custom_metadata_map, source=path)
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:
        raise ContractError(f"{path} is neither a TorchScript archive nor an ONNX file ({type(e).__name__}); "
                            "pass an exported model") from None
    return DeployContract.from_dict({p.key: p.value for p in model.metadata_props}, source=path)


def _read_openvino_contract(path: str) -> DeployContract:
    """The contract in an OpenVINO IR file's rt_info, read as plain XML (openvino is not needed)."""
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as e:
        raise ContractError(f"{path} is not an OpenVINO IR .xml file ({e}): pass an exported model") from None
    section = root.find(f"rt_info/{RT_INFO_SECTION}")
    values = {} if section is None else {entry.tag: entry.get("value", "") for entry in section}
    return DeployContract.from_dict(values, source=path)


def _to_text(value) -> str:
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    return str(value)


def _from_text(text: str, kind):
    if kind in (bool, "bool"):
        if text not in (_TRUE, _FALSE):
            raise ValueError(text)
        return text == _TRUE
    if kind in (int, "int"):
        return int(text)
    return text
