"""A job that cannot form (a machine that never starts, an unreachable --dist-url) ends within
--dist-timeout in one line naming the address and the missing ranks, and touches nothing on disk."""
import socket
import time

import pytest

from reid_engine.reliability.rendezvous import RendezvousError, rendezvous
from tests.faults._jobs import error_lines, job_args, run, snapshot


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_machine_that_never_joins_is_named_within_the_timeout(data_root, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model_0000008.pth").write_bytes(b"an earlier run's checkpoint")
    (out / "last_checkpoint").write_text("model_0000008.pth")
    before = snapshot(out)
    url = f"tcp://127.0.0.1:{_free_port()}"
    start = time.time()
    rc, _, err = run(["--num-machines", "2", "--machine-rank", "0", "--dist-url", url, "--dist-timeout", "3"]
                     + job_args(data_root, str(out)))
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err and "socket.cpp" not in err, err[-3000:]
    (line,) = error_lines(err)
    assert f"the job did not form within 3 s at {url}: rank(s) 1 of 2 (machine(s) 1) never joined" in line
    assert "--dist-timeout" in line
    assert time.time() - start < 120  # start-up of two interpreters on a busy machine, then 3 s
    assert snapshot(out) == before


def test_unreachable_address_is_named_after_the_timeout():
    url = f"tcp://127.0.0.1:{_free_port()}"  # nobody listens there
    start = time.monotonic()
    with pytest.raises(RendezvousError) as info:
        rendezvous(url, world_size=2, rank=1, num_local_workers=1, timeout_s=0.5)
    assert 0.5 <= time.monotonic() - start < 10
    assert f"rank 1 could not reach the rendezvous at {url} within 0.5 s" in str(info.value)
    assert "\n" not in str(info.value)
