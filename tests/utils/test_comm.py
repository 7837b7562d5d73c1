"""comm helpers: answers without a process group, and real collectives in 2 gloo workers."""
import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from reid_engine.engine.launch import launch
from reid_engine.utils import comm


def test_answers_without_a_process_group():
    assert not dist.is_initialized()
    assert (comm.get_world_size(), comm.get_rank(), comm.get_local_rank(), comm.get_local_size()) == (1, 0, 0, 1)
    assert comm.is_main_process()
    comm.synchronize()  # no-op, must not raise
    assert comm.all_gather({"a": 1}) == [{"a": 1}]
    assert comm.gather("x", dst=0) == ["x"]
    np.random.seed(3)
    expected = int(np.random.RandomState(3).randint(2**31))
    assert comm.shared_random_seed() == expected
    losses = {"loss_cls": torch.tensor(2.0)}
    assert comm.reduce_dict(losses) is losses
    with pytest.raises(RuntimeError, match="init_process_group"):
        comm.create_local_process_group(1)
    comm.destroy_process_group()  # nothing to tear down: no error


def collectives_main(out_dir):
    """Worker: run each collective with rank-dependent inputs and write what came back."""
    rank = comm.get_rank()
    np.random.seed(rank)  # different local draws: the shared seed must still agree
    reduced = comm.reduce_dict({"b": torch.tensor(float(rank + 1)), "a": torch.tensor(10.0 * rank)})
    summed = comm.reduce_dict({"a": torch.tensor(10.0 * rank)}, average=False)
    comm.synchronize()
    result = {
        "rank": rank,
        "world_size": comm.get_world_size(),
        "local_rank": comm.get_local_rank(),
        "local_size": comm.get_local_size(),
        "is_main": comm.is_main_process(),
        "all_gather": comm.all_gather({"rank": rank, "name": f"worker{rank}"}),
        "gather_to_0": comm.gather(rank * 3, dst=0),
        "gather_to_1": comm.gather([rank], dst=1),
        "seed": comm.shared_random_seed(),
        "reduced": {k: float(v) for k, v in reduced.items()},
        "summed": float(summed["a"]),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


@pytest.mark.slow
def test_collectives_in_two_gloo_workers(tmp_path):
    launch(collectives_main, 2, dist_url="auto", args=(str(tmp_path),))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["world_size"] == r1["world_size"] == 2
    assert (r0["local_rank"], r1["local_rank"]) == (0, 1) and r0["local_size"] == r1["local_size"] == 2
    assert (r0["is_main"], r1["is_main"]) == (True, False)
    expected = [{"rank": 0, "name": "worker0"}, {"rank": 1, "name": "worker1"}]
    assert r0["all_gather"] == r1["all_gather"] == expected
    assert r0["gather_to_0"] == [0, 3] and r1["gather_to_0"] == []
    assert r0["gather_to_1"] == [] and r1["gather_to_1"] == [[0], [1]]
    # rank 0 seeded numpy with 0: its first draw is the shared seed on both ranks
    assert r0["seed"] == r1["seed"] == int(np.random.RandomState(0).randint(2**31))
    # averages by hand: b = (1 + 2) / 2, a = (0 + 10) / 2; the plain sum of a is 10
    assert r0["reduced"] == r1["reduced"] == {"a": 5.0, "b": 1.5}
    assert r0["summed"] == r1["summed"] == 10.0
