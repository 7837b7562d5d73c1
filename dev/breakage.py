"""Prove that the test suite catches what matters: break the package on purpose, one way at a time.

Each breakage is one search-and-replace in one source file of a scratch copy of the working tree
(its tracked and untracked, not ignored, files), and the few cheapest tests that must then fail.
The script runs them against the copy (PYTHONPATH pointing at it) and prints a table:
breakage, tests run, caught, seconds. It exits 1 when a breakage is not caught, or when its old
text is no longer in the file (the code moved on: update the breakage, don't let it pass).

    python dev/breakage.py              # all of them (about 4 minutes on 2 cores)
    python dev/breakage.py --list       # names, files and tests
    python dev/breakage.py --only sigterm-ignored --only map-ties
    python dev/breakage.py --baseline   # also run each breakage's tests unbroken: they must pass
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, NamedTuple, Sequence, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Breakage(NamedTuple):
    """One deliberate bug: replace `old` by `new` in `file`; one of `tests` must then fail."""

    name: str
    file: str
    old: str
    new: str
    tests: Tuple[str, ...]
    timeout_s: int = 120  # per test (pytest-timeout): a breakage that hangs a test is caught by it


BREAKAGES = (
    Breakage("optimizer-state-not-saved", "reid_engine/engine/train_loop.py",
             'ret["optimizer"] = self.optimizer.state_dict()\n', "\n",
             ("tests/engine/test_train_loop.py::test_simple_trainer_resume_reproduces_the_uninterrupted_run",)),
    Breakage("sampler-state-not-restored", "reid_engine/data/build.py",
             'self._num_batches = int(state["num_batches"])', "self._num_batches = 0",
             ("tests/data/test_build.py::test_resume_continues_stream_with_workers",)),
    Breakage("resume-off-by-one-iteration", "reid_engine/engine/defaults.py",
             "self.start_iter = self.iter + 1", "self.start_iter = self.iter",
             ("tests/data/test_batched_augment.py::test_default_trainer_resume_with_the_batched_path_is_exact",)),
    Breakage("sigterm-ignored", "reid_engine/reliability/preemption.py",
             "            on_first(signum)\n", "            pass\n",
             ("tests/faults/test_preemption.py::test_signal_saves_its_step_restores_handlers_and_resumes_exactly",)),
    Breakage("loader-watchdog-disabled", "reid_engine/reliability/loader_watchdog.py",
             'if self.board is None or not hasattr(iterator, "_timeout"):', "if True:",
             ("tests/faults/test_hung_worker.py::test_a_hung_worker_ends_the_run_in_one_line_with_its_stack",),
             timeout_s=60),
    Breakage("map-ties-by-reversed-index", "reid_engine/evaluation/rank.py",
             "return (rows << (_CODE_BITS + col_bits)) | (codes << col_bits) | cols",
             "return (rows << (_CODE_BITS + col_bits)) | (codes << col_bits) | ((1 << col_bits) - 1 - cols)",
             ("tests/evaluation/test_rank.py",)),
    Breakage("contract-without-mean-std", "reid_engine/inference/contract.py",
             'normalization="inside", pixel_mean=mean, pixel_std=std,', 'normalization="inside",',
             ("tests/export/test_export.py::"
              "test_the_contract_names_mean_std_where_they_apply_and_the_checkpoint_by_checksum",)),
    Breakage("boxmot-normalization-left-out", "reid_engine/export/boxmot.py",
             "return self.features(images * self.scale + self.shift)", "return self.features(images)",
             ("tests/export/test_boxmot.py::test_boxmot_encoder_features_equal_reid_extract",)),
    Breakage("tune-continuation-from-iteration-0", "reid_engine/tune/trial_run.py",
             "args.resume, args.eval_only = list(base.args.opts or []) + extra, resumes is not None, False",
             "args.resume, args.eval_only = list(base.args.opts or []) + extra, False, False",
             ("tests/tune/test_trials.py::test_sigterm_mid_trial_then_same_command_continues_it_bit_exactly",),
             timeout_s=300),
    Breakage("world-size-rule-skipped", "reid_engine/data/train_sampling.py",
             "if old_global != new_global:", "if False:",
             ("tests/data/test_samplers.py",)),
    Breakage("reclustering-at-the-wrong-epoch", "reid_engine/engine/hooks/pseudo_labels.py",
             "if it % self.period == 0 and it != self.cluster_iter:",
             "if it % (2 * self.period) == 0 and it != self.cluster_iter:",
             ("tests/engine/test_label_free.py::test_pseudo_label_loop_logs_and_checkpoints_its_state",),
             timeout_s=300),
    Breakage("error-boundary-prints-a-traceback", "reid_engine/cli/boundary.py",
             "        if debug:\n            traceback.print_exc()\n        _print_error(prog, str(e))",
             "        traceback.print_exc()\n        _print_error(prog, str(e))",
             ("tests/cli/test_boundary.py::test_config_error_is_one_line_with_exit_code_2",)),
)


def copy_tree(dest: str) -> None:
    """Copy the working tree's tracked and untracked (not ignored) files into `dest`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, check=True, capture_output=True).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = os.path.join(REPO_ROOT, rel)
        if not os.path.isfile(src):  # deleted in the work tree but still in the index
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel), follow_symlinks=False)


def run_tests(root: str, tests: Sequence[str], timeout_s: int) -> int:
    """pytest's exit code for `tests` run in `root` with the package imported from there."""
    env = dict(os.environ, PYTHONPATH=root, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", "-p", "no:warnings",
           f"--timeout={timeout_s}", *tests]
    return subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def try_breakage(root: str, b: Breakage, baseline: bool) -> Tuple[str, float]:
    """Apply `b` in `root`, run its tests, put the file back; return (outcome, seconds)."""
    path = os.path.join(root, b.file)
    if not os.path.isfile(path):
        return "file not found", 0.0
    with open(path, encoding="utf-8") as f:
        original = f.read()
    count = original.count(b.old)
    if count != 1:
        return ("old text not found" if count == 0 else f"old text found {count} times"), 0.0
    if baseline and run_tests(root, b.tests, b.timeout_s) != 0:
        return "tests fail unbroken", 0.0
    start = time.monotonic()
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original.replace(b.old, b.new))
        rc = run_tests(root, b.tests, b.timeout_s)
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
    outcome = {0: "no", 1: "yes"}.get(rc, f"no (pytest exit {rc})")
    return outcome, time.monotonic() - start


def main(argv: List[str] = None) -> int:
    """Parse the arguments, run the chosen breakages, print the table; 1 when any is not caught."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this breakage (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the breakages and their tests, run nothing")
    parser.add_argument("--baseline", action="store_true", help="first check each breakage's tests pass unbroken")
    args = parser.parse_args(argv)
    names = {b.name for b in BREAKAGES}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"unknown breakage {', '.join(unknown)} (see --list)")
    chosen = [b for b in BREAKAGES if not args.only or b.name in args.only]
    if args.list:
        for b in chosen:
            print(f"{b.name}\n    {b.file}: {b.old.strip()!r} -> {b.new.strip()!r}\n    tests: {' '.join(b.tests)}")
        return 0
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="reid-breakage-") as root:
        copy_tree(root)
        for i, b in enumerate(chosen, 1):
            print(f"[{i}/{len(chosen)}] {b.name} ...", file=sys.stderr, flush=True)
            outcome, seconds = try_breakage(root, b, args.baseline)
            failed |= outcome != "yes"
            rows.append((b.name, " ".join(t.replace("tests/", "", 1) for t in b.tests), outcome, f"{seconds:.0f}"))
    header = ("breakage", "tests run", "caught", "seconds")
    widths = [max(len(r[c]) for r in (header, *rows)) for c in range(4)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
