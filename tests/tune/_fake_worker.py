"""A reid-tune worker without training, for the study tests: `python -m tests.tune._fake_worker ...`.

It opens (or joins) a study over :data:`SPACE` and runs :func:`reid_engine.tune.study.work_on_study`
with :func:`fake_run_trial`: suggest the params, note the trial in a record file (one JSON line:
pid, trial number, slot, params, output_dir, resumes_trial), sleep, and complete with a value
computed from the params. Flags make it hang in a trial (to be killed), or be preempted.
At the end it prints one JSON line: its pid, the best trial it sees and the study's progress.
"""
import argparse
import json
import os
import sys
import time
from typing import NamedTuple, Tuple

from reid_engine.tune.study import TrialOutcome, open_storage, open_study, study_progress, work_on_study


# The study reads only these fields of reid_engine.tune.space's classes. That module brings in the
# training engine (torch), whose import takes 20 s in each of two processes starting together on a
# busy 2-core machine; the fake workers train nothing and do without it.
class Param(NamedTuple):
    key: str
    kind: str
    low: float = None
    high: float = None
    log: bool = False
    choices: tuple = ()


class Objective(NamedTuple):
    metric: str
    direction: str


class Space(NamedTuple):
    params: Tuple[Param, ...]
    objective: Objective

    @property
    def keys(self):
        return [p.key for p in self.params]


#: a two-key search (no config needed: nothing trains)
SPACE = Space(params=(Param("SOLVER.BASE_LR", "float", 1e-4, 1e-2, log=True),
                      Param("DATALOADER.NUM_INSTANCE", "categorical", choices=(2, 4, 8))),
              objective=Objective("SyntheticReIDTiny/mAP", "maximize"))
BASE_PARAMS = {"SOLVER.BASE_LR": 3.5e-4, "DATALOADER.NUM_INSTANCE": 4}


def fake_value(params) -> float:
    """The objective of a fake trial: best at BASE_LR 1e-3 and NUM_INSTANCE 4 (deterministic)."""
    import math

    return 1.0 - abs(math.log10(params["SOLVER.BASE_LR"]) + 3.0) / 4 - abs(params["DATALOADER.NUM_INSTANCE"] - 4) / 16


def make_run_trial(record: str, out_dir: str, sleep_s: float = 0.0, hang_on_slot: int = 0, preempt_on_slot: int = 0,
                   preempt_attempts: int = 1, fail_on_slot: int = 0, marker: str = ""):
    """The fake `run_trial`: see the module docstring. `hang_on_slot` / `preempt_on_slot` / `fail_on_slot`:
    the slot (1-based) whose first attempt(s) hang (after writing `marker`), raise TrainingPreempted, or fail."""

    def run_trial(trial):
        from optuna.trial import TrialState

        attrs = trial.user_attrs
        if "output_dir" not in attrs:
            trial.set_user_attr("output_dir", os.path.join(out_dir, f"trial_{trial.number:03d}"))
        params = {spec.key: (trial.suggest_float(spec.key, spec.low, spec.high, log=spec.log) if spec.kind == "float"
                             else trial.suggest_categorical(spec.key, list(spec.choices))) for spec in SPACE.params}
        attrs = trial.user_attrs
        slot = attrs.get("slot")
        attempt = 1
        resumed = attrs.get("resumes_trial")
        if resumed is not None:  # count the attempts of this slot: the chain of resumes_trial
            attempt = 1 + sum(1 for t in trial.study.get_trials(deepcopy=False) if t.user_attrs.get("slot") == slot
                              and t.number < trial.number)
        line = {"pid": os.getpid(), "number": trial.number, "slot": slot, "params": params,
                "output_dir": attrs["output_dir"], "resumes_trial": resumed, "attempt": attempt}
        with open(record, "a") as f:
            f.write(json.dumps(line) + "\n")
        if slot == hang_on_slot and resumed is None:
            with open(marker, "w") as f:
                f.write(json.dumps(line))
            time.sleep(3600)  # killed by the test
        time.sleep(sleep_s)
        if slot == preempt_on_slot and attempt <= preempt_attempts:
            from reid_engine.reliability.preemption import TrainingPreempted

            trial.report(0.5, step=attempt)  # an evaluation before the stop
            raise TrainingPreempted.stopped(15, 7, os.path.join(attrs["output_dir"], "model_0000007.pth"))
        if slot == fail_on_slot:
            return TrialOutcome(TrialState.FAIL, error="a fake failure\nwith a second line")
        trial.report(fake_value(params), step=10)
        return TrialOutcome(TrialState.COMPLETE, fake_value(params))

    return run_trial


def _wait_for_workers(barrier: str, workers: int) -> None:
    """Start trials only when `workers` workers have joined (they then share the study from its start)."""
    os.makedirs(barrier, exist_ok=True)
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(barrier)) < workers and time.time() < deadline:
        time.sleep(0.05)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study-name", default="fake")
    parser.add_argument("--n-trials", type=int, default=4)
    parser.add_argument("--heartbeat-s", type=float, default=1.0)
    parser.add_argument("--poll-s", type=float, default=0.2)
    parser.add_argument("--record", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--sleep-s", type=float, default=0.2)
    parser.add_argument("--hang-on-slot", type=int, default=0)
    parser.add_argument("--marker", default="")
    parser.add_argument("--barrier", default="")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)

    storage = open_storage(args.storage, heartbeat_s=args.heartbeat_s)
    study = open_study(storage, args.study_name, SPACE, args.n_trials, 0, BASE_PARAMS, "median")
    if args.barrier:
        _wait_for_workers(args.barrier, args.workers)
    work_on_study(study, make_run_trial(args.record, args.out_dir, args.sleep_s, hang_on_slot=args.hang_on_slot,
                                        marker=args.marker), poll_s=args.poll_s)
    best = study.best_trial
    print(json.dumps({"pid": os.getpid(), "best": best.number, "best_value": best.value,
                      "progress": study_progress(study)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
