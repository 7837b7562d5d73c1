"""Copies of real data: hidden and system files (._*, .DS_Store, __MACOSX/, Thumbs.db) and other non-image files are left out."""

import os

import pytest

from reid_engine.data.datasets import get_dataset
from reid_engine.data.datasets.paths import is_hidden_or_system
from tests.data import test_datasets as trees
from tests.data.datasets import test_folder_names
from tests.data.datasets.fake_trees import touch, write

JUNK = (".DS_Store", "Thumbs.db", "readme.txt")


def sprinkle(base):
    """Add what a macOS / Windows copy carries to every folder below ``base``: AppleDouble twins
    of the files, .DS_Store, Thumbs.db, a readme.txt, and a __MACOSX/ mirror. Returns how many
    entries the listings must leave out."""
    added = 0
    for folder, dirs, files in list(os.walk(base)):
        for name in files:
            touch(os.path.join(folder, "._" + name))
            touch(os.path.join(folder, "__MACOSX", "._" + name))
        for name in JUNK:
            touch(os.path.join(folder, name))
        added += len(files) + len(JUNK) + 1
    return added


def parsed(name, root):
    dataset = get_dataset(name, root, key="DATASETS.TESTS" if name == "sensereid" else "DATASETS.NAMES")
    return test_folder_names._relative(dataset)


def test_the_rule():
    for name in ("._0001_c1s1_000151_00.jpg", ".DS_Store", "__MACOSX", "__macosx", "Thumbs.db", "thumbs.db",
                 "desktop.ini", ".hidden"):
        assert is_hidden_or_system(name), name
    for name in ("0001_c1s1_000151_00.jpg", "_x.jpg", "MACOSX", "Thumbs.db.jpg"):
        assert not is_hidden_or_system(name), name


def test_market_root_copied_from_a_mac_parses_to_exactly_the_real_images(tmp_path):
    root = str(tmp_path)
    base = trees.make_market(root)
    clean = parsed("Market1501", root)
    query = os.path.join(base, "query")
    touch(os.path.join(query, "._0001_c1s1_000151_00.jpg"))
    touch(os.path.join(query, "__MACOSX", "._0003_c1s1_000001_00.jpg"))
    for name in (".DS_Store", "Thumbs.db", "readme.txt"):
        touch(os.path.join(query, name))
    touch(os.path.join(base, "__MACOSX", "query", "._0003_c1s1_000001_00.jpg"))
    assert parsed("Market1501", root) == clean


@pytest.mark.parametrize("name", sorted(test_folder_names.BUILDERS))
def test_every_parser_leaves_hidden_system_and_other_files_out(tmp_path, name):
    root = str(tmp_path)
    test_folder_names.BUILDERS[name](root)
    clean = parsed(name, root)
    sprinkle(root)
    assert parsed(name, root) == clean


def test_own_folders_and_csv_lists_leave_them_out(tmp_path):
    root = str(tmp_path)
    base = os.path.join(root, "shop")
    for split, identity, image in (("train", "alice", "alice_c1_1.jpg"), ("train", "bob", "bob_c2_1.jpg"),
                                   ("query", "carol", "carol_c1_1.jpg"), ("gallery", "carol", "carol_c2_1.jpg")):
        trees.touch(os.path.join(base, split, identity), image)
    clean = parsed("ImageFolder:shop", root)
    sprinkle(base)  # also a __MACOSX/ folder beside the identity folders: not an identity
    assert parsed("ImageFolder:shop", root) == clean
    # A list written from such a copy names the AppleDouble twins too: their rows are left out.
    write(os.path.join(base, "train.csv"), "path,id,camera\ntrain/alice/alice_c1_1.jpg,alice,1\n"
                                           "train/alice/._alice_c1_1.jpg,alice,1\n__MACOSX/train/bob/._bob_c2_1.jpg,bob,2\n"
                                           "train/bob/bob_c2_1.jpg,bob,2\n")
    assert parsed("ImageFolder:shop", root) == clean


def test_walking_a_tree_does_not_follow_folder_links(tmp_path):
    root = str(tmp_path)
    test_folder_names.BUILDERS["Shinpuhkan"](root)
    clean = parsed("Shinpuhkan", root)
    os.symlink(os.path.join(root, "shinpuhkan"), os.path.join(root, "shinpuhkan", "0001", "loop"))
    assert parsed("Shinpuhkan", root) == clean  # as os.walk did: no loop, no double images
