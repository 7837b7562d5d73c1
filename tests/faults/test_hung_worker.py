"""A data-loader worker that hangs without dying (here: a training image that became a named pipe, so
its open() blocks like a read on a stalled network file system) ends the run in one line naming the
worker, the index and path it is stuck on and the file holding its threads' stacks, within the hang
timeout plus 10 s; and the watchdog's automatic timeout follows the slowest batch."""
import os
import shutil
import time

import numpy as np
import pytest
from PIL import Image

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data.build import build_reid_train_loader
from reid_engine.reliability import loader_watchdog
from reid_engine.reliability.loader_watchdog import LoaderHangError, LoaderWatchdog, check_hang_timeout
from tests.conftest import records_of

HANG_TIMEOUT = 1.0


def _tiny_root(root):
    """An ImageFolder set 'tiny' of 16x32 images: 4 ids x 2 for training, one each in query and gallery."""
    for split, cameras in (("train", (1, 2)), ("query", (1,)), ("gallery", (2,))):
        for pid in range(1, 5):
            for cam in cameras:
                path = root / "tiny" / split / f"{pid:03d}" / f"{pid:03d}_c{cam}_0.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                pixels = np.random.default_rng(pid * 3 + cam).integers(0, 256, (32, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(path, quality=90)
    return root


def _cfg(root):
    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(root)
    cfg.DATASETS.NAMES = ("ImageFolder:tiny",)
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    cfg.DATALOADER.SAMPLER_TRAIN = "NaiveIdentitySampler"
    cfg.DATALOADER.NUM_INSTANCE = 2
    cfg.DATALOADER.NUM_WORKERS = 2
    cfg.DATALOADER.CACHE_IMAGES = "off"  # the pipe must be read by a worker, not by the cache filler
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SEED = 3
    return cfg


@pytest.mark.slow
@pytest.mark.timeout(60)  # without the watchdog the loop would wait forever
def test_a_hung_worker_ends_the_run_in_one_line_with_its_stack(tmp_path, caplog):
    loader = build_reid_train_loader(_cfg(_tiny_root(tmp_path / "data")))
    loader.hang_timeout = HANG_TIMEOUT
    # After the folder scan, one image becomes a named pipe nobody writes: its open() blocks forever.
    index, (stuck_path, _, _) = 5, loader.dataset.items[5]
    os.unlink(stuck_path)
    os.mkfifo(stuck_path)
    iterator, batches = iter(loader), 0
    with records_of(caplog, loader_watchdog.__name__), pytest.raises(LoaderHangError) as info:
        while batches < 50:  # 8 items: the pipe is in the first epoch's batches
            waited_from = time.monotonic()
            next(iterator)
            batches += 1
    took = time.monotonic() - waited_from
    err = info.value
    message = str(err)
    assert "\n" not in message, message
    assert HANG_TIMEOUT <= took <= HANG_TIMEOUT + 10, took
    assert err.worker_id in (0, 1) and err.index == index, message
    # Both workers may have a batch with the pipe in it: each is asked for its stacks, then stopped.
    pids = [int(path.rsplit("-pid", 1)[1][:-4]) for path in err.stack_files]
    (stack_file,) = [path for path in err.stack_files if f"worker{err.worker_id}-pid" in path]
    pid = int(stack_file.rsplit("-pid", 1)[1][:-4])
    assert f"data-loader worker {err.worker_id} (pid {pid}) has been reading training item {index} " in message
    assert f"'{stuck_path}'" in message and stack_file in message and "DATALOADER.HANG_TIMEOUT 1 s" in message
    assert "--resume" in message
    # faulthandler's dump: every thread of the worker, the stuck one blocked in read_image's open()
    with open(stack_file) as f:
        stacks = f.read()
    assert "common.py" in stacks and "in read_image" in stacks, stacks
    assert any("in read_image" in r.getMessage() for r in caplog.records)  # also logged, for the run's log
    for worker_pid in pids:  # stopped on the way out (not left for the loader's 5 s wait each)
        with pytest.raises(ProcessLookupError):
            os.kill(worker_pid, 0)
    shutil.rmtree(os.path.dirname(stack_file))  # kept by the watchdog for the user to read


def test_hang_timeout_is_automatic_from_the_slowest_batch_and_checked(tmp_path):
    dataset = type("Items", (), {})()
    watchdog = LoaderWatchdog(dataset, num_workers=2)
    assert watchdog.limit() == loader_watchdog.HANG_TIMEOUT_FLOOR  # no batch seen yet
    watchdog.board.values[1 * 4 + 3] = 7.5  # worker 1's slowest batch
    assert watchdog.limit() == pytest.approx(75.0)
    assert LoaderWatchdog(dataset, num_workers=2, timeout=3).limit() == 3.0
    assert LoaderWatchdog(dataset, num_workers=0).board is None  # nothing to watch in-process
    assert check_hang_timeout(0) == 0.0
    for bad in (-1, "60", True):
        with pytest.raises(ConfigError, match="DATALOADER.HANG_TIMEOUT"):
            check_hang_timeout(bad)
