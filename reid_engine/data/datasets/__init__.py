"""Datasets: the registry, the base class, every benchmark parser and SyntheticReID.

Importing this package registers every dataset class in :data:`DATASET_REGISTRY`.
"""

from ..synthetic import (  # re-exported: the generator moved to data.synthetic
    DEFAULT_SPEC,
    TINY_SPEC,
    SyntheticSpec,
    SyntheticWorld,
    ensure_synthetic_reid,
    generate_synthetic_reid,
    write_contact_sheet,
)
from .audit import FileProblem, collect_file_problems
from .bases import DatasetFormatError, ImageDataset, check_cross_camera_matches, merge_train_sets
from .catalog import get_dataset, testable_dataset_names
from .cuhk0x import cuhk01, cuhk02
from .cuhk03 import CUHK03, CUHK03Detected, CUHK03Labeled
from .dukemtmc import DukeMTMC
from .image_folder import ImageFolderReID
from .market1501 import Market1501, Market1501_500k
from .market_style import MarketStyleDataset, parse_market_style_folder
from .msmt17 import MSMT17
from .paths import DatasetNotFoundError, resolve_data_root
from .registry import DATASET_REGISTRY
from .sensereid import sensereid
from .split_benchmarks import grid, ilids, prid, viper
from .splits import SplitFileError
from .synthetic import (
    SyntheticReID,
    SyntheticReIDShifted,
    SyntheticReIDShiftedTiny,
    SyntheticReIDTiny,
    SyntheticVideoReID,
    SyntheticVideoReIDTiny,
)
from .training_only import (
    GRID,
    LPW,
    PKU,
    PRAI,
    PRID,
    SAIVT,
    AirportALERT,
    CAVIARa,
    PeS3D,
    SenseReID,
    Shinpuhkan,
    SYSU_mm,
    Thermalworld,
    VIPeR,
    WildTrackCrop,
    cuhkSYSU,
    cuhksysu,
    iLIDS,
)
from .university1652 import university1652
from .vehicleid import LargeVehicleID, MediumVehicleID, SmallVehicleID, VehicleID
from .veri import VeRi
from .veriwild import LargeVeRiWild, MediumVeRiWild, SmallVeRiWild, VeRiWild
from .video import VideoDataset, dukemtmcvidreid, ilidsvid, is_video_dataset, mars, prid2011

__all__ = [
    "DATASET_REGISTRY", "resolve_data_root", "get_dataset", "merge_train_sets",
    "check_cross_camera_matches", "ImageDataset", "MarketStyleDataset",
    "parse_market_style_folder", "DatasetFormatError", "DatasetNotFoundError",
    "Market1501", "Market1501_500k", "DukeMTMC", "MSMT17", "CUHK03", "CUHK03Labeled", "CUHK03Detected", "VeRi",
    "VehicleID", "SmallVehicleID", "MediumVehicleID", "LargeVehicleID", "ImageFolderReID",
    "SyntheticReID", "SyntheticReIDTiny", "SyntheticReIDShifted", "SyntheticReIDShiftedTiny",
    "SyntheticSpec", "SyntheticWorld", "DEFAULT_SPEC",
    "TINY_SPEC", "generate_synthetic_reid", "ensure_synthetic_reid", "write_contact_sheet",
    "FileProblem", "collect_file_problems", "testable_dataset_names", "SplitFileError",
    "VeRiWild", "SmallVeRiWild", "MediumVeRiWild", "LargeVeRiWild",
    "cuhkSYSU", "AirportALERT", "iLIDS", "PKU", "PRAI", "PRID", "GRID", "SAIVT", "SenseReID", "SYSU_mm",
    "Thermalworld", "PeS3D", "CAVIARa", "VIPeR", "LPW", "Shinpuhkan", "WildTrackCrop",
    "cuhk01", "cuhk02", "university1652", "viper", "ilids", "prid", "grid", "cuhksysu", "sensereid",
    "VideoDataset", "is_video_dataset", "SyntheticVideoReID", "SyntheticVideoReIDTiny",
    "mars", "ilidsvid", "prid2011", "dukemtmcvidreid",
]
