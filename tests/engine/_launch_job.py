"""Jobs for the launch tests that need their own OS process (run as a script).

    python _launch_job.py machines MACHINE_RANK DIST_URL OUT_DIR   # 1 worker of a 2-machine job
    python _launch_job.py fail OUT_DIR                             # worker 1 raises, worker 0 sleeps
    python _launch_job.py torchrun OUT_DIR                         # RANK etc. come from the env

Workers write what they saw to OUT_DIR/rank<R>.json; the test reads them back.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from reid_engine.engine.launch import launch  # noqa: E402
from reid_engine.utils import comm  # noqa: E402


def record_main(out_dir):
    """Write this worker's view of the job (ranks, sizes, a gathered value, pid)."""
    info = {
        "rank": comm.get_rank(),
        "world_size": comm.get_world_size(),
        "local_rank": comm.get_local_rank(),
        "local_size": comm.get_local_size(),
        "gathered": comm.all_gather(comm.get_rank() * 10),
        "pid": os.getpid(),
    }
    with open(os.path.join(out_dir, f"rank{info['rank']}.json"), "w") as f:
        json.dump(info, f)


def failing_main(out_dir):
    """Worker 1 raises once both have joined; worker 0 would sleep far past the test's limit."""
    with open(os.path.join(out_dir, f"pid{comm.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    comm.synchronize()
    if comm.get_rank() == 1:
        with open(os.path.join(out_dir, "raised_at"), "w") as f:
            f.write(repr(time.time()))
        raise ValueError("worker 1 failed on purpose")
    time.sleep(300)


def main(argv):
    mode = argv[0]
    if mode == "machines":
        machine_rank, url, out_dir = int(argv[1]), argv[2], argv[3]
        launch(record_main, 1, num_machines=2, machine_rank=machine_rank, dist_url=url, args=(out_dir,), backend="gloo")
    elif mode == "fail":
        launch(failing_main, 2, dist_url="auto", args=(argv[1],), backend="gloo")
    elif mode == "torchrun":
        out_dir = argv[1]
        with open(os.path.join(out_dir, f"main{os.environ['RANK']}"), "w") as f:
            f.write(str(os.getpid()))
        launch(record_main, 1, args=(out_dir,), backend="gloo")
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
