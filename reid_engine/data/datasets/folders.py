"""The folder names each dataset is accepted under, below the data root: ours, fast-reid's, torchreid's.

A user who moves from fast-reid or torchreid keeps their datasets folder: every dataset
accepts the folder its peers read, as well as ours. The names are tried in the order
given (ours first, then fast-reid's, then torchreid's); when several exist the first is
read and the choice is logged (:func:`.paths.find_dataset_dir`). Each name is the folder
the dataset's own layout starts in. datasets/README.md lists the same table.
"""

from typing import Dict, Sequence, Tuple, Union

__all__ = ["DATASET_FOLDERS", "dataset_folders"]

DATASET_FOLDERS: Dict[str, Tuple[str, ...]] = {
    # Market-style benchmarks. torchreid nests the release folders; its flat
    # 'market1501/' (files directly inside) is its older, still accepted, layout.
    "Market1501": ("Market-1501-v15.09.15", "market1501/Market-1501-v15.09.15", "market1501"),
    "DukeMTMC": ("DukeMTMC-reID", "dukemtmc-reid/DukeMTMC-reID"),
    "MSMT17": ("MSMT17_V1", "MSMT17_V2", "msmt17/MSMT17_V1", "msmt17/MSMT17_V2"),
    # Vehicles (torchreid has none of them).
    "VeRi": ("VeRi", "veri"),
    "VehicleID": ("VehicleID_V1.0", "vehicleid"),
    "VeRiWild": ("VERI-Wild",),
    # torchreid's benchmarks; where fast-reid trains on the same release, its folder too.
    "cuhk01": ("cuhk01",),
    "cuhk02": ("cuhk02/Dataset",),
    "viper": ("viper/VIPeR", "VIPeR"),
    "ilids": ("ilids",),
    "prid": ("prid2011",),
    "grid": ("grid",),
    "sensereid": ("sensereid/SenseReID", "SenseReID"),
    "university1652": ("university1652/University-Release",),
    "cuhksysu": ("cuhksysu", "cuhk_sysu"),
    # torchreid's video sets ('DukeMTMC-VideoReID/' is the release's own folder name).
    "mars": ("mars",),
    "ilidsvid": ("ilids-vid",),
    "prid2011": ("prid2011",),
    "dukemtmcvidreid": ("dukemtmc-vidreid/DukeMTMC-VideoReID", "DukeMTMC-VideoReID"),
    # fast-reid's training-only sets; where torchreid reads the same release, its folder too.
    "cuhkSYSU": ("cuhk_sysu", "cuhksysu"),
    "AirportALERT": ("AirportALERT",),
    "iLIDS": ("iLIDS",),
    "PKU": ("PKUv1a_128x48",),
    "PRAI": ("PRAI-1581",),
    "PRID": ("prid_2011", "prid2011/prid_2011"),
    "GRID": ("underground_reid", "grid/underground_reid"),
    "SAIVT": ("SAIVT-SoftBio",),
    "SenseReID": ("SenseReID", "sensereid/SenseReID"),
    "SYSU_mm": ("SYSU-MM01",),
    "Thermalworld": ("thermalworld_rgb",),
    "PeS3D": ("3DPeS",),
    "CAVIARa": ("CAVIARa",),
    "VIPeR": ("VIPeR", "viper/VIPeR"),
    "LPW": ("pep_256x128/data_slim",),
    "Shinpuhkan": ("shinpuhkan",),
    "WildTrackCrop": ("Wildtrack_crop_dataset",),
}


def dataset_folders(dataset: Union[str, type], default: Sequence[str] = ()) -> Tuple[str, ...]:
    """The accepted folder names of a dataset, in order of preference.

    Args:
        dataset: a registered name, or a dataset class (its own name first, then those of
            the classes it derives from: ``SmallVehicleID`` reads ``VehicleID``'s folders).
        default: returned when the table has no entry.
    Returns:
        The folder names, relative to the data root.
    """
    names = [c.__name__ for c in dataset.__mro__] if isinstance(dataset, type) else [dataset]
    for name in names:
        if name in DATASET_FOLDERS:
            return DATASET_FOLDERS[name]
    return tuple(default)
