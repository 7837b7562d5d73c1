"""Every read a run makes, not only the training loader's workers, ends in one line naming the file when
it never returns (here: images replaced by named pipes nobody writes): the decoded-image cache's fill, the
training loader without workers, the evaluation loader (with and without worker processes), the label-free
hook's feature extraction and `reid-extract`, each within the hang timeout plus a few seconds, with the
stuck thread's stack kept."""
import errno
import os
import re
import shutil
import threading
import time

import pytest

from reid_engine.config import get_cfg
from reid_engine.data import build_reid_test_loader, build_reid_train_loader
from reid_engine.reliability.loader_watchdog import LoaderHangError
from reid_engine.reliability.read_deadline import ReadHangError
from tests.inference.conftest import tiny_checkpoint, tiny_config_file  # noqa: F401  (reid-extract's model)

HANG_TIMEOUT = 0.5
DATASET = "SyntheticReIDTiny"


def _fifo_root(data_root, tmp_path, split):
    """A copy of the tiny set whose first identity's images of `split` are named pipes; (root, pipes)."""
    root = tmp_path / "data"
    shutil.copytree(os.path.join(data_root, DATASET), root / DATASET)
    folder = root / DATASET / split
    first = sorted(os.listdir(folder))[0].split("_")[0]
    pipes = [str(folder / name) for name in sorted(os.listdir(folder)) if name.startswith(first + "_")]
    for pipe in pipes:
        os.unlink(pipe)
        os.mkfifo(pipe)
    return str(root), pipes


@pytest.fixture
def release():
    """Unblock the threads this process left stuck opening the pipes (a writer that closes at once), and
    wait for them to end."""
    pipes, before = [], set(threading.enumerate())  # threads of earlier tests in this worker are not ours to wait for
    yield pipes
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a thread may go on to the next pipe: until they have all ended
        for pipe in pipes:
            try:
                os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as exc:  # ENXIO: nobody is reading it now
                assert exc.errno in (errno.ENXIO, errno.ENOENT), exc
        if not [t for t in set(threading.enumerate()) - before
                if t.daemon and t.name.startswith(("image-cache-", "data-loader"))]:
            break
        time.sleep(0.02)


def _cfg(root, *extra):
    cfg = get_cfg()
    cfg.merge_from_list(["DATASETS.ROOT", root, "DATASETS.NAMES", (DATASET,), "DATASETS.TESTS", (DATASET,),
                         "INPUT.SIZE_TRAIN", [64, 32], "INPUT.SIZE_TEST", [64, 32], "SOLVER.IMS_PER_BATCH", 16,
                         "DATALOADER.NUM_INSTANCE", 4, "DATALOADER.NUM_WORKERS", 0, "TEST.IMS_PER_BATCH", 32,
                         "DATALOADER.HANG_TIMEOUT", HANG_TIMEOUT, *extra])
    return cfg


def _assert_names_a_pipe(err, pipes, took, where):
    message = str(err)
    assert "\n" not in message and isinstance(err, ReadHangError), message
    assert HANG_TIMEOUT <= took <= HANG_TIMEOUT + 8, took
    assert any(f"'{pipe}'" in message for pipe in pipes), message
    assert f"DATALOADER.HANG_TIMEOUT {HANG_TIMEOUT:g} s" in message and where in message, message
    stacks = open(err.stack_files[0]).read()
    assert "in read_image" in stacks, stacks  # the stuck thread, blocked opening the file
    shutil.rmtree(os.path.dirname(err.stack_files[0]))  # kept for the user to read


@pytest.mark.timeout(60)
def test_the_image_cache_fill(data_root, tmp_path, release):
    root, pipes = _fifo_root(data_root, tmp_path, "bounding_box_train")
    release.extend(pipes)
    start = time.monotonic()
    with pytest.raises(ReadHangError) as info:
        build_reid_train_loader(_cfg(root, "DATALOADER.CACHE_IMAGES", "on"))
    _assert_names_a_pipe(info.value, pipes, time.monotonic() - start, "a read for the decoded-image cache did not return within")
    assert "thread image-cache-" in str(info.value)


@pytest.mark.timeout(60)
def test_the_training_loader_without_workers(data_root, tmp_path, release):
    root, pipes = _fifo_root(data_root, tmp_path, "bounding_box_train")
    release.extend(pipes)
    loader = build_reid_train_loader(_cfg(root, "DATALOADER.CACHE_IMAGES", "off"))
    start = time.monotonic()
    with pytest.raises(ReadHangError) as info:
        for _ in zip(range(50), loader):  # 156 images: the pipes are in the first epoch's batches
            start = time.monotonic()
    _assert_names_a_pipe(info.value, pipes, time.monotonic() - start, "a read for a training batch did not return")
    assert "thread data-loader of this process" in str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1])
def test_the_evaluation_loader(data_root, tmp_path, release, workers):
    root, pipes = _fifo_root(data_root, tmp_path, "query")
    release.extend(pipes)
    loader, _ = build_reid_test_loader(_cfg(root, "DATALOADER.NUM_WORKERS", workers), DATASET)
    start = time.monotonic()
    with pytest.raises(ReadHangError) as info:
        for _ in loader:
            pass
    what = f"batch of {DATASET} query + gallery"
    _assert_names_a_pipe(info.value, pipes, time.monotonic() - start,
                         f"no {what} came for" if workers else f"a read for a {what} did not return within")
    if workers:  # the workers' watchdog: names the worker, then stops it
        assert isinstance(info.value, LoaderHangError) and "data-loader worker 0 (pid " in str(info.value)
    else:
        assert "thread data-loader of this process" in str(info.value)


@pytest.mark.timeout(60)
def test_the_label_free_feature_extraction(data_root, tmp_path, release):
    from tests.engine.test_label_free import tiny_cfg, train

    root, pipes = _fifo_root(data_root, tmp_path, "bounding_box_train")
    release.extend(pipes)
    cfg = tiny_cfg(root, tmp_path / "out", "DATALOADER.CACHE_IMAGES", "off", "DATALOADER.HANG_TIMEOUT", HANG_TIMEOUT)
    start = time.monotonic()
    with pytest.raises(ReadHangError) as info:
        train(cfg)  # the pseudo labels of the first round: the extraction reads every training image
    _assert_names_a_pipe(info.value, pipes, time.monotonic() - start, "a read for a batch of images did not return")
    assert not [name for name in os.listdir(tmp_path / "out") if name.endswith(".pth")]


@pytest.mark.timeout(60)
def test_reid_extract(tiny_config_file, data_root, tmp_path, release, capsys):  # noqa: F811 (the fixture)
    from reid_engine.cli import extract

    root, pipes = _fifo_root(data_root, tmp_path, "query")
    release.extend(pipes)
    out = tmp_path / "query.npz"
    out.write_bytes(b"an earlier result")
    start = time.monotonic()
    code = extract.main(["--config-file", tiny_config_file, "--image-dir", os.path.join(root, DATASET, "query"),
                         "--output", str(out), "DATALOADER.HANG_TIMEOUT", str(HANG_TIMEOUT)])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert code == 1 and line.startswith("reid-extract: error: a read for a batch of images did not return"), err[-3000:]
    assert any(f"'{pipe}'" in line for pipe in pipes) and took <= HANG_TIMEOUT + 15, (line, took)
    assert out.read_bytes() == b"an earlier result"  # nothing written over
    stack_file = re.search(r"kept in (\S+\.txt):", line).group(1)
    assert "in read_image" in open(stack_file).read()
    shutil.rmtree(os.path.dirname(stack_file))
