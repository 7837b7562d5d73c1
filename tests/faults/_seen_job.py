"""`_train_job.py` (fault injection) that also records what every worker trains on, for the resume tests.

    python _seen_job.py train_net args...            (also as torchrun's script)

With REID_TEST_SEEN_DIR set, every worker appends one JSON line per step to
``<dir>/seen.rank<R>.jsonl``: ``{"iter", "world", "paths", "pixels", "losses"}``, where ``pixels``
are MD5 digests of the augmented uint8 images as the model gets them and ``losses`` this worker's
loss values. Patched at import, so spawned workers (which import this script again) record too.
"""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import tests.faults._train_job  # noqa: E402,F401  (REID_TEST_SIGNAL_AT / REID_TEST_STEP_DELAY)
from reid_engine.engine.train_loop import SimpleTrainer  # noqa: E402
from reid_engine.utils import comm  # noqa: E402

_train_on_batch = SimpleTrainer.train_on_batch
_stage_metrics = SimpleTrainer._stage_metrics
_seen_dir = os.environ.get("REID_TEST_SEEN_DIR", "")


def _recording_train_on_batch(self, data, data_time):
    self._seen = {"iter": self.iter, "world": comm.get_world_size(), "paths": list(data["img_paths"]),
                  "pixels": [hashlib.md5(image.numpy().tobytes()).hexdigest() for image in data["images"]]}
    _train_on_batch(self, data, data_time)


def _recording_stage_metrics(self, loss_dict, data_time):
    _stage_metrics(self, loss_dict, data_time)
    record = dict(self._seen, losses={k: float(v) for k, v in loss_dict.items()})
    with open(os.path.join(_seen_dir, f"seen.rank{comm.get_rank()}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


if _seen_dir:
    SimpleTrainer.train_on_batch = _recording_train_on_batch
    SimpleTrainer._stage_metrics = _recording_stage_metrics

if __name__ == "__main__":
    from reid_engine.cli.train import main

    sys.exit(main(sys.argv[1:]))
