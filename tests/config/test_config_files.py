"""The shipped config files: each loads and passes the value checks a run does first, and
fast-reid's own files of the families we ship load unchanged and mean the same.

Files naming a backbone family of another module (ResNeSt, OSNet, MobileNetV3) pass only
where that family is registered, i.e. in the merged tree.
"""
import glob
import os
import shutil

import pytest

from reid_engine.config import get_cfg
from reid_engine.engine.config_checks import check_config_values
from tests.conftest import REPO_ROOT

CONFIG_DIR = os.path.join(REPO_ROOT, "configs")
#: configs/tune/ holds reid-tune's search spaces, not configs (tests/tune checks them)
CONFIG_FILES = sorted(path for path in (os.path.relpath(p, CONFIG_DIR) for p in
                                        glob.glob(os.path.join(CONFIG_DIR, "**", "*.yml"), recursive=True))
                      if not path.startswith("tune" + os.sep))

# fast-reid's Base-MGN.yml and Market1501/mgn_R50-ibn.yml, as its repository has them
FASTREID_MGN_FILES = {
    "Base-MGN.yml": """_BASE_: Base-SBS.yml

MODEL:
  META_ARCHITECTURE: MGN

  FREEZE_LAYERS: [backbone, b1, b2, b3,]

  BACKBONE:
    WITH_NL: False

  HEADS:
    EMBEDDING_DIM: 256
""",
    "Market1501/mgn_R50-ibn.yml": """_BASE_: ../Base-MGN.yml

MODEL:
  BACKBONE:
    WITH_IBN: True

DATASETS:
  NAMES: ("Market1501",)
  TESTS: ("Market1501",)

OUTPUT_DIR: logs/market1501/mgn_R50-ibn
""",
}


def _load(path):
    cfg = get_cfg()
    cfg.merge_from_file(path)
    return cfg


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_file_loads_and_its_values_check(name, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # KD.MODEL_CONFIG paths are relative to the working directory (fast-reid's)
    check_config_values(_load(os.path.join(CONFIG_DIR, name)))


def test_every_dataset_has_each_family():
    for dataset in ("Market1501", "DukeMTMC", "MSMT17"):
        for family in ("bagtricks", "AGW", "sbs"):
            for backbone in ("R50", "R50-ibn", "S50"):
                assert f"{dataset}/{family}_{backbone}.yml" in CONFIG_FILES
        assert f"{dataset}/mgn_R50-ibn.yml" in CONFIG_FILES


def test_fastreid_mgn_files_load_unchanged_and_equal_ours(tmp_path):
    for base in ("Base-bagtricks.yml", "Base-SBS.yml"):
        shutil.copy(os.path.join(CONFIG_DIR, base), tmp_path / base)
    for name, text in FASTREID_MGN_FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    theirs = _load(str(tmp_path / "Market1501" / "mgn_R50-ibn.yml"))
    ours = _load(os.path.join(CONFIG_DIR, "Market1501", "mgn_R50-ibn.yml"))
    assert theirs.MODEL.META_ARCHITECTURE == "MGN" and theirs.MODEL.FREEZE_LAYERS == ["backbone", "b1", "b2", "b3"]
    theirs.OUTPUT_DIR = ours.OUTPUT_DIR
    assert theirs == ours
