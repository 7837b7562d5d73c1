#!/usr/bin/env python
"""One-call GPU acceptance run: each part a child process under its own time cap, one table at the end.

The parts that give the headline figures run alone, one after another; then the others run in a
pool, ``--jobs`` (4) at a time, so that every family fits one call (see "Sharing" below).

On a GPU machine (sized for one H100 and 16 cores, about 8 minutes), from the repository root,
with a CUDA build of torch and the requirements installed (from local wheels where the machine has
no internet: ``pip install --no-index --no-deps wheels/*.whl``; docs/maintainers/gpu_acceptance.md):

    python3 tools/gpu_acceptance.py

It ends within ``--budget`` seconds (470) plus a second of packing, data generation included.
Everything lands in ``$OUT/acceptance/`` (``output/acceptance/`` without $OUT): ``logs/<part>.log``
(each part's stdout and stderr), ``runs/<part>/`` (a training run's log.txt, metrics.json and
config.yaml; its checkpoints stay in ``--work`` and are deleted), ``results.json`` and
``table.md``, all packed into ``$OUT/acceptance_logs.tar.gz`` every ``--pack-every`` seconds and
at the end, so a call cut off from outside still brings its logs back.

Parts, in this order: first those that run alone (nothing else running beside them), then the
shared ones, most telling first.
- ``env``: torch, CUDA, cuDNN, triton, the GPU, the CPUs, whether reid_engine imports, and how
  many files the inductor cache holds (0 on a bare machine: every compile time is then cold).
- ``data``: SyntheticReID (3,822 training images: 59 iterations of batch 64 per epoch) and
  SyntheticVideoReID under the data root, generated when missing (about 25 s on one core).
- ``bot_eager`` / ``bot_auto`` / ``bot_auto_warm``: BoT ResNet-50
  (configs/Market1501/bagtricks_R50.yml, 256x128, batch 64, AMP) on SyntheticReID for 2 epochs
  with an evaluation at the end: MODEL.COMPILE off; auto (the whole model, auto's scope for it);
  auto again for 1 epoch on the inductor cache bot_auto filled (what a second run of a recipe
  pays to start compiled). ``bot_auto`` is also the family row of bagtricks_R50.
- ``fastreid``: fast-reid's tools/train_net.py on the same data, only where ``import fastreid``
  works and its checkout has tools/ (otherwise one row "not installed", no time spent).
- shared: ``family:<name>``: 1 epoch of one config of each other shipped family under
  MODEL.COMPILE auto, most telling first (sbs_R50, whose freeze release recompiles; the ViT; AGW;
  MGN; then the other backbones; the table is tools/benchmarks/families.py, which
  bench_compile_time.py measures too); those the budget leaves out get "skipped: budget": run them in
  a second call with ``--parts family:<name> ...``. Every run sets MODEL.BACKBONE.PRETRAIN False.
  kd-sbs_R101-ibn-sbs_R34's teacher is a fresh sbs_R101-ibn written by ``--write-teacher`` first
  (its logits are noise: the row measures speed and compile, not distillation); sbs_R50 ends
  its frozen-backbone phase at iteration 30, so the documented recompilation happens inside
  the epoch; mars is configs/MARS/bagtricks_R50.yml on SyntheticVideoReID (batch 16 tracklets,
  3 epochs of 9 iterations); kd-ema_sbs_R34 (self-distillation) comes last.
- shared: ``cuda_tests``: the test files with a ``torch.cuda.is_available()`` skipif (found in
  tests/ when the script starts), ``pytest -m "" -rA -vv`` with ``-n 4`` when pytest-xdist is there.
- shared: ``bot_auto_blocks``: bot_auto with MODEL.COMPILE_SCOPE blocks (its bottlenecks compiled
  one by one), 2 epochs.

Sharing: a shared part starts, in the order above, as soon as fewer than ``--jobs`` parts run
(``--jobs 1``: one by one); each keeps its own cap and the budget, and starts only with
``--min-start`` seconds left. A cold torch.compile is mostly single-threaded CPU work (dynamo,
AOTAutograd), so parts compiling beside each other overlap well. Each pooled part gets
TORCHINDUCTOR_COMPILE_THREADS = CPUs // jobs (unless set) and, on a full-size run, at most
max(2, CPUs // jobs) loader workers where its config asks for more (plan_rules.loader_workers
takes the config's 8 as it is): four parts would otherwise start 32 loader processes and
64 compile workers on 16 cores. Step times of shared rows were measured on a shared GPU and are
indicative; the guard's eager / compiled ratio is measured within one process, close in time.

The compiled rows set MODEL.COMPILE_WEIGH_COST False: under its cost rule auto keeps a run of
1-2 epochs eager (compiling would not pay for itself in so few iterations), and these rows are
there to measure the compilation.

Columns of the table (``-``: not measured or not applicable; results.json holds the same fields,
null for ``-``; notes and compile decisions over 100 characters are cut in the table and
printed in full below it):
- part; status: ok | failed (exit N) | killed after N s (cap) | killed after N s (budget) |
  skipped: budget | skipped: <reason> | not installed | interrupted;
- wall s: the part's commands from start to end (start-up, compilation and evaluation included);
- shared: how many other parts ran beside it at most (0: alone the whole time);
- step s: median ``time`` of the training steps in metrics.json (steps that compiled left out);
- img/s: SOLVER.IMS_PER_BATCH / step s (tracklets/s for mars);
- peak MB: the largest ``max_mem`` of the run's progress lines (CUDA memory allocated);
- compile s, eager step s, compiled step s, recompiles, compile: from the last
  ``Compile summary: {json}`` line of the run's log.txt (CompileGuard: compile time, median
  eager and compiled step, recompilations after warm-up, ``mode: decision (reason)``);
- speedup: eager step s / compiled step s;
- mAP: the final evaluation's mAP (%, its ``copypaste:`` lines);
- note: env facts, the test counts and failed tests, or the last line of a failed or killed
  part's log.

Exit status: 0 when the script itself worked, whatever the parts did (read the table); 2 for
bad arguments; 1 where reid_engine does not import (the env part's facts are printed alone),
when interrupted (SIGTERM / SIGINT: every running part's process group is killed and its row
says "interrupted", the results so far are written and packed) or on an internal error.

On a CPU (the tests): ``--device cpu --tiny`` runs every part on SyntheticReIDTiny at 64x32 with
quarter-width ResNet-18s (or each family's smallest member), batch 16, 1 epoch: 15-45 s a part
on 2 cores. ``--list`` prints the parts (alone or shared), their caps and commands;
docs/gpu_acceptance.md has it all, with an estimate of the run's length.
"""
import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import queue
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tools", "benchmarks")]
from families import BOT, FAMILIES, Family  # noqa: E402  (the table bench_compile_time.py measures too)

try:
    from reid_engine.config import get_cfg, load_yaml_with_bases
    from reid_engine.runtime.cpu_budget import usable_cpus
    from reid_engine.utils.file_io import atomic_open, atomic_write, atomic_write_text
except ImportError as e:  # main() then runs the env part alone: its facts say why the package does not import
    PACKAGE_ERROR: Optional[ImportError] = e
else:
    PACKAGE_ERROR = None

TRAIN_NET = os.path.join(REPO, "tools", "train_net.py")
TEACHER_CONFIG = "configs/Market1501/sbs_R101-ibn.yml"
COMPILE_SUMMARY = "Compile summary: "
MARK = "[gpu_acceptance] "  # starts the lines this script adds to a part's log
TEST_OUTCOME = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR)\b")

DEFAULT_BUDGET = 470.0
DEFAULT_JOBS = 4
# Seconds per part (a family without its own entry gets "family"). The parts run alone (env, data,
# bot_eager, bot_auto, bot_auto_warm) may take 30 + 90 + 60 + 120 + 60 = 360 s at worst (about
# 160 s measured on an H100); the pool fills what is left, 4 parts at a time.
DEFAULT_CAPS = {"env": 30, "data": 90, "bot_eager": 60, "bot_auto": 120, "bot_auto_warm": 60, "bot_auto_blocks": 120,
                "fastreid": 120, "cuda_tests": 100, "family": 90, "family:sbs_R50": 120, "family:bagtricks_vit": 120,
                "family:kd-sbs_R101-ibn-sbs_R34": 120, "family:mars": 120, "fake": 60}
POLL_S = 0.1  # how often a running part looks for an interrupt of the whole run


# A run of 1-2 epochs would stay eager under auto's cost rule (compiling would not pay for itself in
# so few iterations): the acceptance rows measure the compilation, so they turn the rule off.
COMPILE_ALWAYS = ("MODEL.COMPILE_WEIGH_COST", "False")
TINY_OVERRIDES = ("INPUT.SIZE_TRAIN", "[64, 32]", "INPUT.SIZE_TEST", "[64, 32]", "INPUT.AUTOAUG.ENABLED", "False",
                  "DATALOADER.NUM_WORKERS", "0", "DATALOADER.NUM_INSTANCE", "4", "SOLVER.IMS_PER_BATCH", "16",
                  "SOLVER.AMP.ENABLED", "False", "SOLVER.WARMUP_ITERS", "2", "TEST.IMS_PER_BATCH", "64",
                  "CUDNN_BENCHMARK", "False")
TINY_TEACHER_YAML = "MODEL:\n  BACKBONE: {DEPTH: 18x, WIDTH_MULT: 0.25, WITH_NL: False}\n"

# The env part: facts as one "ENV {json}" line (reid_engine's import last, so the facts come first).
ENV_PROBE = r"""
import importlib.metadata as md, json, os, platform
import torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version(), "triton": version("triton"), "cpus": os.cpu_count(), "gpu": None}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    facts.update(gpu=p.name, capability=f"{p.major}.{p.minor}", memory_gb=round(p.total_memory / 2**30, 1),
                 gpus=torch.cuda.device_count(), bf16=torch.cuda.is_bf16_supported())
try:
    from reid_engine.runtime.compile import inductor_cache_dir
    cache = inductor_cache_dir()
    facts["reid_engine"] = "ok"
    facts["inductor_cache_files"] = sum(len(f) for _, _, f in os.walk(cache))
except Exception as e:
    facts["reid_engine"] = f"{type(e).__name__}: {e}"
print("ENV " + json.dumps(facts), flush=True)
"""
VIDEO_DATA = "import sys; from reid_engine.data.datasets import get_dataset; get_dataset(sys.argv[1], sys.argv[2])"


@dataclasses.dataclass
class Part:
    """A part of the run: commands run one after the other under one cap, and how to read its results."""

    name: str
    kind: str  # env | data | train | tests | fake
    commands: List[List[str]] = dataclasses.field(default_factory=list)
    run_dir: Optional[str] = None  # a training run's OUTPUT_DIR
    cleanup: List[str] = dataclasses.field(default_factory=list)  # folders removed before it starts
    skip: str = ""  # the status when it cannot run here ("not installed", "skipped: ...")
    shared: bool = False  # may run beside other shared parts (with --jobs > 1); else it runs alone


@dataclasses.dataclass
class Outcome:
    """How a part's commands ended."""

    status: str
    wall_s: float


class Interrupted(Exception):
    """SIGTERM reached the script."""


# ---------------------------------------------------------------------------------------- parts
def data_names(tiny: bool) -> Dict[str, str]:
    """{"image": training set, "video": tracklet set} of the run's size."""
    suffix = "Tiny" if tiny else ""
    return {"image": "SyntheticReID" + suffix, "video": "SyntheticVideoReID" + suffix}


def train_command(args, config: str, run_dir: str, compile_mode: str, epochs: int, extra: Sequence[str] = (),
                  tiny: Sequence[str] = (), dataset: Optional[str] = None) -> List[str]:
    """tools/train_net.py on `config` pointed at the synthetic set, with an evaluation at the end only."""
    dataset = dataset or data_names(args.tiny)["image"]
    overrides = ["DATASETS.ROOT", args.data_root, "DATASETS.NAMES", f'("{dataset}",)', "DATASETS.TESTS",
                 f'("{dataset}",)', "MODEL.DEVICE", args.device, "MODEL.BACKBONE.PRETRAIN", "False", *extra]
    if args.tiny:
        overrides += [*TINY_OVERRIDES, *tiny]
    # DELAY_EPOCHS must stay below MAX_EPOCH; CHECKPOINT_PERIOD past the end: model_final only.
    overrides += ["MODEL.COMPILE", compile_mode, "SOLVER.MAX_EPOCH", str(epochs), "TEST.EVAL_PERIOD", str(epochs),
                  "SOLVER.DELAY_EPOCHS", "0", "SOLVER.CHECKPOINT_PERIOD", "1000", "SEED", "0", "OUTPUT_DIR", run_dir]
    return [sys.executable, TRAIN_NET, "--config-file", os.path.join(REPO, config), *overrides]


def cuda_test_files(tests_dir: str = os.path.join(REPO, "tests")) -> List[str]:
    """Test files with a ``torch.cuda.is_available()`` skipif, relative to the repository."""
    found = []
    for folder, _, names in os.walk(tests_dir):
        for name in sorted(names):
            path = os.path.join(folder, name)
            if name.startswith("test_") and name.endswith(".py"):
                with open(path, encoding="utf-8") as f:
                    if any("skipif" in line and "torch.cuda.is_available()" in line for line in f):
                        found.append(os.path.relpath(path, REPO))
    return sorted(found)


def fastreid_part(args, epochs: int) -> Part:
    """fast-reid's BoT R50 on the same data when its checkout is importable, else a row saying why not."""
    run_dir = os.path.join(args.work, "fastreid")
    part = Part("fastreid", "train", run_dir=run_dir, cleanup=[run_dir])
    spec = importlib.util.find_spec("fastreid")
    if spec is None or not spec.origin:
        part.skip = "not installed"
        return part
    checkout = os.path.dirname(os.path.dirname(spec.origin))
    script, config = (os.path.join(checkout, p) for p in ("tools/train_net.py", "configs/Market1501/bagtricks_R50.yml"))
    if not (os.path.isfile(script) and os.path.isfile(config)):
        part.skip = f"skipped: no tools/train_net.py and configs/ in {checkout}"
        return part
    # fast-reid reads Market1501 from $FASTREID_DATASETS/Market-1501-v15.09.15: SyntheticReID's layout.
    root = os.path.join(args.work, "fastreid_datasets")
    target = os.path.join(args.data_root, data_names(args.tiny)["image"])
    part.commands = [["mkdir", "-p", root], ["ln", "-sfn", target, os.path.join(root, "Market-1501-v15.09.15")],
                     ["env", f"FASTREID_DATASETS={root}", sys.executable, script, "--config-file", config,
                      "MODEL.DEVICE", args.device, "MODEL.BACKBONE.PRETRAIN", "False", "SOLVER.MAX_EPOCH", str(epochs),
                      "TEST.EVAL_PERIOD", str(epochs), "SOLVER.CHECKPOINT_PERIOD", "1000", "OUTPUT_DIR", run_dir]]
    return part


def family_part(args, family: Family) -> Part:
    """1 epoch (or `family.epochs`) of the family's config under MODEL.COMPILE auto."""
    name = f"family:{family.name}"
    run_dir = os.path.join(args.work, safe_name(name))
    part = Part(name, "train", run_dir=run_dir, cleanup=[run_dir])
    extra = list(family.extra)
    if family.teacher:
        folder = os.path.join(args.work, "kd_teacher")
        part.cleanup.append(folder)
        part.commands.append([sys.executable, os.path.abspath(__file__), "--write-teacher", folder,
                              "--data-root", args.data_root] + (["--tiny"] if args.tiny else []))
        extra += ["KD.MODEL_CONFIG", f'("{folder}/teacher.yml",)', "KD.MODEL_WEIGHTS", f'("{folder}/teacher.pth",)']
    dataset = data_names(args.tiny)["video" if family.video else "image"]
    extra += COMPILE_ALWAYS
    part.commands.append(train_command(args, family.config, run_dir, "auto", family.epochs, extra, family.tiny, dataset))
    return part


def limit_loader_workers(part: Part, jobs: int, cpus: int) -> None:
    """Cap DATALOADER.NUM_WORKERS of a pooled training part to its share of the CPUs (at least 2).

    plan_rules.loader_workers takes the config's count as it is (8 in the shipped recipes): four
    parts beside each other would start 32 loader processes on 16 cores. A config (or the default,
    when no file sets it) at or under the share is left as it is."""
    command = part.commands[-1]
    share = max(2, cpus // jobs)
    cfg = get_cfg()
    cfg.merge_from_file(command[command.index("--config-file") + 1])
    if cfg.DATALOADER.NUM_WORKERS > share:
        command += ["DATALOADER.NUM_WORKERS", str(share)]


def build_parts(args) -> List[Part]:
    """Every part, in the default order (see the module doc): those that run alone first, then the
    shared ones, most telling first; training parts that will share the machine get fewer loader workers."""
    py, names = sys.executable, data_names(args.tiny)
    epochs = 1 if args.tiny else 2
    parts = [
        Part("env", "env", [[py, "-c", ENV_PROBE]]),
        Part("data", "data", [[py, os.path.join(REPO, "tools", "make_synthetic.py"), "--root", args.data_root]
                              + (["--tiny"] if args.tiny else []), [py, "-c", VIDEO_DATA, names["video"], args.data_root]]),
    ]
    # bot_auto compiles what auto chooses (the whole model), bot_auto_blocks the repeated blocks: the
    # compile time and steady speed of both scopes, side by side. bot_auto_warm repeats bot_auto's
    # recipe (1 epoch) on the cache bot_auto filled: the warm start. The headline figures (eager,
    # auto, warm, fast-reid) run alone: a shared GPU would blur them.
    bot = {}
    for name, mode, extra, n in (("bot_eager", "off", (), epochs), ("bot_auto", "auto", COMPILE_ALWAYS, epochs),
                                 ("bot_auto_warm", "auto", COMPILE_ALWAYS, 1),
                                 ("bot_auto_blocks", "auto", COMPILE_ALWAYS + ("MODEL.COMPILE_SCOPE", "blocks"), epochs)):
        run_dir = os.path.join(args.work, name)
        bot[name] = Part(name, "train", [train_command(args, BOT.config, run_dir, mode, n, extra, tiny=BOT.tiny)],
                         run_dir=run_dir, cleanup=[run_dir])
    parts += [bot["bot_eager"], bot["bot_auto"], bot["bot_auto_warm"], fastreid_part(args, epochs)]
    pool = [family_part(args, family) for family in FAMILIES if family is not BOT]
    files = cuda_test_files()
    xdist = ["-n", "4"] if importlib.util.find_spec("xdist") else []
    pool.append(Part("cuda_tests", "tests", [[py, "-m", "pytest", "-p", "no:cacheprovider", "-m", "", "-rA", "-vv", *xdist,
                                              *files]], skip="" if files else "skipped: no CUDA-only test files"))
    pool.append(bot["bot_auto_blocks"])
    for part in pool:
        part.shared = True
        if part.kind == "train" and args.jobs > 1 and not args.tiny:  # tiny runs load in the process
            limit_loader_workers(part, args.jobs, usable_cpus()[0])
    parts += pool
    parts += [Part(name, "fake", [shlex.split(command)], shared=shared) for name, command, shared in args.fake_part]
    return parts


def select_parts(parts: List[Part], names: Optional[List[str]]) -> List[Part]:
    """The parts named (a name, or "family" for every family), in the default order; all when None.

    Raises:
        ValueError: a name that is no part (the message lists them).
    """
    if not names:
        return list(parts)
    known = {p.name for p in parts}
    unknown = [n for n in names if n not in known and n != "family"]
    if unknown:
        raise ValueError(f"unknown part {', '.join(unknown)}; choose from family, {', '.join(p.name for p in parts)}")
    return [p for p in parts if p.name in names or ("family" in names and p.name.startswith("family:"))]


def cap_of(name: str, caps: Dict[str, float]) -> float:
    """The part's cap: its own entry, else its group's ("family" for "family:x"), else the fake parts'."""
    return caps.get(name, caps.get(name.split(":")[0], caps["fake"]))


# ----------------------------------------------------------------------------------- running
def safe_name(name: str) -> str:
    """A part name as a file name ("family:AGW_R50" -> "family-AGW_R50")."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the part's process group (loader and compile workers included); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _wait(proc: subprocess.Popen, until: float, stop: Optional[threading.Event]) -> Optional[int]:
    """The process's exit status, or None once the monotonic time `until` passes or `stop` is set."""
    while True:
        left = until - time.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=left if stop is None else min(left, POLL_S))


def run_commands(commands: List[List[str]], log_path: str, limit_s: float, limit_kind: str, grace_s: float,
                 env: Optional[Dict[str, str]] = None, stop: Optional[threading.Event] = None) -> Outcome:
    """Run `commands` one after another, each in its own process group, all within `limit_s` seconds.

    Output goes to `log_path`. Past the limit the group gets SIGTERM, then SIGKILL after `grace_s`.
    Whatever happens (an interrupt too), nothing of the group is left running afterwards.

    Args:
        limit_kind: what set the limit ("cap" or "budget"), for the status.
        stop: set from another thread when the whole run is interrupted: the group gets SIGKILL
            at once (as on an interrupt in this thread) and the status is "interrupted".
    Returns:
        ok | failed (exit N) | failed (signal N) | killed after N s (<limit_kind>) | interrupted,
        and the wall time.
    """
    start = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        for command in commands:
            log.write(f"{MARK}$ {shlex.join(command)}\n")
            log.flush()
            proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = _wait(proc, start + limit_s, stop)
                if rc is None:
                    if stop is not None and stop.is_set():
                        status = "interrupted"  # the finally below kills the group at once
                    else:
                        _signal_group(proc, signal.SIGTERM)
                        if _wait(proc, time.monotonic() + grace_s, stop) is None:
                            _signal_group(proc, signal.SIGKILL)
                            proc.wait()
                        status = f"killed after {limit_s:.0f} s ({limit_kind})"
                    log.write(f"{MARK}{status}\n")
                    return Outcome(status, time.monotonic() - start)
            finally:
                if proc.poll() is None:  # interrupted while waiting
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
                _signal_group(proc, signal.SIGKILL)  # leftovers of a finished leader
            if rc != 0:
                status = f"failed (exit {rc})" if rc > 0 else f"failed (signal {-rc})"
                log.write(f"{MARK}{status}\n")
                return Outcome(status, time.monotonic() - start)
    return Outcome("ok", time.monotonic() - start)


class Packer:
    """Packs a folder into one .tar.gz every `every` seconds from a thread, and once more at stop().

    Each pack is written atomically (utils.file_io.atomic_open), so the archive is always whole.
    """

    def __init__(self, folder: str, archive: str, every: float):
        self.folder, self.archive, self.every = folder, archive, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="packer", daemon=True)

    def pack(self) -> None:
        """Write the archive now (the folder as its top-level entry; the archive and its temporaries left out)."""
        folder, name = os.path.split(os.path.abspath(self.archive))

        def keep(info):
            where, base = os.path.split(os.path.join(os.path.dirname(self.folder), info.name))
            ours = where == folder and (base == name or (base.startswith(f".{name}.") and base.endswith(".tmp")))
            return None if ours else info

        with atomic_open(self.archive, "wb") as f, tarfile.open(fileobj=f, mode="w:gz", compresslevel=6) as tar:
            tar.add(self.folder, arcname=os.path.basename(self.folder), filter=keep)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.pack()
            except (OSError, tarfile.TarError):  # a file changed under us: the next round packs it
                pass

    def start(self) -> "Packer":
        """Start the thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and pack one last time."""
        self._stop.set()
        self._thread.join()
        self.pack()


@contextlib.contextmanager
def sigterm_raises():
    """SIGTERM raises :class:`Interrupted` in the main thread (SIGINT already raises KeyboardInterrupt)."""
    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------------- parsing
def read_text(path: str) -> str:
    """A file's text, '' when it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def parse_compile_summary(text: str) -> Optional[dict]:
    """The JSON object of the last ``Compile summary: {...}`` line of a log; None without one (or unreadable)."""
    lines = [line for line in text.splitlines() if COMPILE_SUMMARY in line]
    if not lines:
        return None
    try:
        summary, _ = json.JSONDecoder().raw_decode(lines[-1].split(COMPILE_SUMMARY, 1)[1].strip())
    except ValueError:
        return None
    return summary if isinstance(summary, dict) else None


def compile_columns(summary: Optional[dict]) -> dict:
    """The compile columns of a Compile summary (all None without one)."""
    if summary is None:
        return dict.fromkeys(("compile_s", "eager_step_s", "compiled_step_s", "speedup", "recompiles", "compile"))
    eager, compiled = summary.get("eager_step_s"), summary.get("compiled_step_s")
    decision = f"{summary.get('mode', '?')}: {summary.get('decision', '?')}"
    return {"compile_s": summary.get("compile_s"), "eager_step_s": eager, "compiled_step_s": compiled,
            "speedup": eager / compiled if eager and compiled else None, "recompiles": summary.get("recompiles"),
            "compile": decision + (f" ({summary['reason']})" if summary.get("reason") else "")}


def read_map(log_text: str) -> Optional[float]:
    """The mAP of the last results the evaluator printed (the first test set), None without any."""
    from reid_engine.evaluation import parse_csv_format  # imports torch: only when a run is read

    results = parse_csv_format(log_text)
    value = next(iter(results.values()), {}).get("mAP")
    return value if isinstance(value, float) else None


def step_columns(run_dir: str) -> dict:
    """Median step time of metrics.json and images/s at the run's SOLVER.IMS_PER_BATCH."""
    times = []
    for line in read_text(os.path.join(run_dir, "metrics.json")).splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and isinstance(record.get("time"), (int, float)):
                times.append(record["time"])
    step = statistics.median(times) if times else None
    try:
        batch = load_yaml_with_bases(os.path.join(run_dir, "config.yaml"))["SOLVER"]["IMS_PER_BATCH"]
    except Exception:  # no config written (killed early), or not a dumped config
        batch = None
    return {"step_s": step, "img_s": batch / step if step and isinstance(batch, int) else None}


def train_columns(part: Part, log_text: str) -> dict:
    """Speed, memory, compile and mAP columns of a training run (from its OUTPUT_DIR)."""
    run_log = read_text(os.path.join(part.run_dir, "log.txt"))
    peaks = [int(m) for m in re.findall(r"max_mem: (\d+)M", run_log)]
    return {**step_columns(part.run_dir), "peak_mb": max(peaks) if peaks else None,
            **compile_columns(parse_compile_summary(run_log)), "mAP": read_map(run_log)}


def pytest_columns(part: Part, log_text: str) -> dict:
    """The note of a pytest run: its counts and the tests that failed; a run cut off before its
    summary is counted from its per-test lines (-vv)."""
    lines = log_text.splitlines()
    counts = [line for line in lines if re.search(r"\d+ (passed|failed|skipped|errors?)\b", line)]
    if counts:
        note, failed = counts[-1].strip("= "), re.findall(r"^(?:FAILED|ERROR) (\S+)", log_text, re.M)
    else:
        per_test = [(TEST_OUTCOME.search(line).group(1), next(t for t in line.split() if "::" in t))
                    for line in lines if "::" in line and TEST_OUTCOME.search(line)]
        outcomes = [outcome for outcome, _ in per_test]
        note = ("before the summary: " + ", ".join(f"{outcomes.count(o)} {o.lower()}" for o in sorted(set(outcomes)))
                if per_test else "no test ran")
        failed = [test for outcome, test in per_test if outcome in ("FAILED", "ERROR")]
    return {"note": note + (f"; failed: {', '.join(failed)}" if failed else "")}


def env_columns(part: Part, log_text: str) -> dict:
    """The note of the env part: its facts in one line."""
    lines = [line for line in log_text.splitlines() if line.startswith("ENV {")]
    if not lines:
        return {}
    f = json.loads(lines[-1][4:])
    gpu = (f"{f['gpu']} sm{f.get('capability')} {f.get('memory_gb')} GB x{f.get('gpus')}, bf16 {f.get('bf16')}"
           if f.get("gpu") else "no CUDA device")
    return {"note": f"torch {f['torch']} (CUDA {f['cuda']}, cuDNN {f['cudnn']}), triton {f['triton']}, "
                    f"{gpu}, {f['cpus']} CPUs, Python {f['python']}, reid_engine {f.get('reid_engine')}, "
                    f"inductor cache {f.get('inductor_cache_files')} files"}


READERS: Dict[str, Callable[[Part, str], dict]] = {"train": train_columns, "tests": pytest_columns, "env": env_columns}


def summarize(part: Part, status: str, wall_s: Optional[float], log_text: str) -> dict:
    """The part's row: status, wall time and what its kind's reader finds; a failure's last log line as the note."""
    row = {"part": part.name, "status": status, "wall_s": wall_s}
    if part.kind in READERS and wall_s is not None:
        try:
            row.update(READERS[part.kind](part, log_text))
        except Exception as e:  # a reader must not cost the other rows
            row["note"] = f"could not read the results: {type(e).__name__}: {e}"
    if status != "ok" and not row.get("note"):
        tail = [line.strip() for line in log_text.splitlines() if line.strip() and not line.startswith(MARK)]
        row["note"] = tail[-1][:160] if tail else None
    return row


def keep_run_files(part: Part, out: str) -> None:
    """Copy a run's log.txt, metrics.json and config.yaml into <out>/runs/<part>/; delete the part's
    checkpoints (and teacher weights): hundreds of MB each on the GPU machine's disk."""
    if part.run_dir and os.path.isdir(part.run_dir):
        dest = os.path.join(out, "runs", safe_name(part.name))
        os.makedirs(dest, exist_ok=True)
        for name in ("log.txt", "metrics.json", "config.yaml"):
            if os.path.isfile(os.path.join(part.run_dir, name)):
                shutil.copyfile(os.path.join(part.run_dir, name), os.path.join(dest, name))
    for top in part.cleanup:
        for folder, _, names in os.walk(top):
            for name in names:
                if name.endswith(".pth"):
                    os.remove(os.path.join(folder, name))


# ------------------------------------------------------------------------------------ output
COLUMNS = (("part", "part", None), ("status", "status", None), ("wall_s", "wall s", ".0f"), ("shared", "shared", None),
           ("step_s", "step s", ".4f"), ("img_s", "img/s", ".0f"), ("peak_mb", "peak MB", ".0f"),
           ("compile_s", "compile s", ".1f"), ("eager_step_s", "eager step s", ".4f"),
           ("compiled_step_s", "compiled step s", ".4f"), ("speedup", "speedup", ".2f"),
           ("recompiles", "recompiles", None), ("compile", "compile", None), ("mAP", "mAP", ".2f"),
           ("note", "note", None))


NOTE_WIDTH = 100  # longer notes are cut in the table and given in full below it


def _cell(value, fmt: Optional[str], width: int = NOTE_WIDTH) -> str:
    if value is None or value == "":
        return "-"
    if fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt)
    text = str(value).replace("|", "/")
    return text if len(text) <= width else text[:width - 3] + "..."


def format_table(rows: List[dict]) -> str:
    """The rows as one pipe table, "-" for what was not measured; then the notes and compile
    decisions that were too long for it, in full."""
    from tabulate import tabulate

    body = [[_cell(row.get(key), fmt) for key, _, fmt in COLUMNS] for row in rows]
    table = tabulate(body, headers=[title for _, title, _ in COLUMNS], tablefmt="pipe", disable_numparse=True)
    long = [f"- {row['part']} ({key}): {row[key]}" for row in rows for key in ("compile", "note")
            if len(str(row.get(key) or "")) > NOTE_WIDTH]
    return table + ("\n\n" + "\n".join(long) if long else "")


def write_results(out: str, rows: List[dict], meta: dict) -> None:
    """results.json (rows and run facts) and table.md, as they stand."""
    atomic_write_text(os.path.join(out, "results.json"), json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    atomic_write_text(os.path.join(out, "table.md"), format_table(rows) + "\n")


# -------------------------------------------------------------------------------------- main
def parse_caps(items: List[str]) -> Dict[str, float]:
    """DEFAULT_CAPS with `part=seconds` items applied (part may be a group: "family")."""
    caps = dict(DEFAULT_CAPS)
    for item in items:
        name, sep, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not sep or not name or seconds <= 0:
            raise ValueError(f"--caps {item!r}: write part=seconds, e.g. bot_auto=200 or family=60")
        caps[name] = seconds
    return caps


def parse_fake_part(item: str, shared: bool = False):
    """`name=command` of the hidden --fake-part (runs alone) and --fake-shared-part options (tests)."""
    name, sep, command = item.partition("=")
    if not sep or not name or not command:
        raise argparse.ArgumentTypeError(f"{item!r}: write name=command")
    return name, command, shared


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    env_out = os.environ.get("OUT")
    parser.add_argument("--out", default=os.path.join(env_out, "acceptance") if env_out else "output/acceptance",
                        help="results folder (default: $OUT/acceptance, else output/acceptance)")
    parser.add_argument("--archive", default="", help="the .tar.gz of --out (default: acceptance_logs.tar.gz beside it)")
    parser.add_argument("--work", default="output/acceptance_work", help="training runs' OUTPUT_DIRs (checkpoints)")
    parser.add_argument("--data-root", default="datasets", help="where the synthetic sets are (generated if missing)")
    parser.add_argument("--device", default="cuda", help="MODEL.DEVICE of the training runs")
    parser.add_argument("--tiny", action="store_true", help="tiny models and data (a CPU test of the pipeline)")
    parser.add_argument("--parts", nargs="+", default=None, help="parts to run (default: all, in order; 'family': all families)")
    parser.add_argument("--caps", nargs="+", default=[], metavar="PART=SECONDS", help="time caps per part or group")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="seconds for the whole run")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                        help="shared parts (the families, cuda_tests, bot_auto_blocks) run this many at once; 1: one by one")
    parser.add_argument("--min-start", type=float, default=20.0, help="a part starts only with this many seconds left")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--pack-every", type=float, default=5.0, help="seconds between archive refreshes")
    parser.add_argument("--list", action="store_true", help="print the parts with their caps and commands, run nothing")
    # Test parts, in the order given: --fake-part runs alone, --fake-shared-part in the pool.
    parser.add_argument("--fake-part", action="append", type=parse_fake_part, default=[], help=argparse.SUPPRESS)
    parser.add_argument("--fake-shared-part", action="append", dest="fake_part", help=argparse.SUPPRESS,
                        type=lambda item: parse_fake_part(item, shared=True))
    parser.add_argument("--write-teacher", default="", help=argparse.SUPPRESS)
    return parser


def write_teacher(folder: str, data_root: str, tiny: bool) -> None:
    """A fresh (untrained) sbs_R101-ibn teacher for the kd family: teacher.yml and teacher.pth in `folder`,
    its classifier as wide as the synthetic training set's identities."""
    import torch

    from reid_engine.data.datasets import get_dataset
    from reid_engine.modeling.meta_arch.baseline import Baseline

    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, "teacher.yml")
    atomic_write_text(config, f"_BASE_: {os.path.join(REPO, TEACHER_CONFIG)}\n" + (TINY_TEACHER_YAML if tiny else ""))
    cfg = get_cfg()
    cfg.merge_from_file(config)
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = get_dataset(data_names(tiny)["image"], data_root).num_train_pids
    torch.manual_seed(0)
    weights = os.path.join(folder, "teacher.pth")
    atomic_write(weights, lambda f: torch.save({"model": Baseline.from_config(cfg).state_dict()}, f))
    print(f"teacher written: {config}, {weights} ({cfg.MODEL.HEADS.NUM_CLASSES} classes)")


def part_env(part: Part, jobs: int) -> Dict[str, str]:
    """The environment of a part's commands.

    A pooled part gets its share of the CPUs for inductor's compile workers (by default as many
    as the machine has, in each of the parts compiling at once), unless the user set the count."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    if part.shared and jobs > 1:
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, usable_cpus()[0] // jobs)))
    return env


def skip_status(part: Part, left_s: float, min_start_s: float) -> str:
    """Why the part does not start with `left_s` seconds of the budget left ("" when it starts)."""
    return part.skip or ("skipped: budget" if left_s < min_start_s else "")


def run_part(part: Part, args, out: str, deadline: float, caps: Dict[str, float],
             stop: Optional[threading.Event] = None) -> dict:
    """Run one part (that :func:`skip_status` let start) within its cap and what is left of the budget; its row."""
    left = deadline - time.monotonic()
    cap = cap_of(part.name, caps)
    limit, kind = (cap, "cap") if cap <= left - args.grace else (max(1.0, left - args.grace), "budget")
    for folder in part.cleanup:
        shutil.rmtree(folder, ignore_errors=True)
    log_path = os.path.join(out, "logs", safe_name(part.name) + ".log")
    try:
        outcome = run_commands(part.commands, log_path, limit, kind, args.grace, part_env(part, args.jobs), stop)
    finally:
        keep_run_files(part, out)
    return summarize(part, outcome.status, outcome.wall_s, read_text(log_path))


def max_overlap(span: Sequence[float], others: Sequence[Sequence[Optional[float]]]) -> int:
    """How many of the `others` (start, end) spans ran at once beside `span` at most (end None: still running)."""
    start, end = span
    live = [(s, float("inf") if e is None else e) for s, e in others if s < end and (e is None or e > start)]
    # the count only rises at a start: the span's own or one inside it
    return max(sum(1 for s, e in live if s <= t < e) for t in [start] + [s for s, _ in live if s > start])


def may_start(part: Part, running: List[Part], jobs: int) -> bool:
    """Whether `part` may start beside the `running` ones: a part alone only on an idle machine,
    a shared one beside shared ones only, up to `jobs` at once."""
    return not running or (part.shared and all(p.shared for p in running) and len(running) < jobs)


def run_all(parts: List[Part], args, out: str, caps: Dict[str, float], meta: dict, rows: List[dict]) -> None:
    """Run the parts, each started in list order once :func:`may_start` lets it, each in a thread.

    `rows` holds the rows in the parts' order (not the order they end in), the running ones as
    "running"; the results are written after every start and end. An interrupt (raised in this,
    the main thread) kills every running part's process group, marks those parts "interrupted"
    and propagates."""
    start = time.monotonic()
    deadline = start + args.budget
    done: Dict[int, dict] = {}
    spans: Dict[int, List[Optional[float]]] = {}  # [start, end] of the parts that ran, by index
    running: Dict[int, threading.Thread] = {}
    finished: "queue.Queue" = queue.Queue()  # (index, row, end) from the threads
    stop = threading.Event()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - start:4.0f} s] {text}", flush=True)

    def publish() -> None:
        rows[:] = [done.get(i, {"part": parts[i].name, "status": "running"}) for i in sorted({*done, *running})]
        meta["elapsed_s"] = round(time.monotonic() - start, 1)
        write_results(out, rows, meta)

    def work(i: int) -> None:
        try:
            row = run_part(parts[i], args, out, deadline, caps, stop)
        except Exception as e:  # a fault of this script in one part must not leave the pool waiting
            row = {"part": parts[i].name, "status": f"failed (script error: {type(e).__name__}: {e})", "wall_s": None}
        finished.put((i, row, time.monotonic()))

    def end(i: int, row: dict, end_s: float) -> None:
        spans[i][1] = end_s
        others = [span for j, span in spans.items() if j != i]
        done[i] = {**row, "shared": max_overlap(spans[i], others) if row["wall_s"] is not None else None}
        running.pop(i).join()

    index = 0
    try:
        while index < len(parts) or running:
            while index < len(parts) and may_start(parts[index], [parts[i] for i in running], args.jobs):
                part = parts[index]
                say(f"{part.name} ...")
                status = skip_status(part, deadline - time.monotonic(), args.min_start)
                if status:
                    done[index] = {**summarize(part, status, None, ""), "shared": None}
                    say(f"{part.name}: {status}")
                else:
                    spans[index] = [time.monotonic(), None]
                    thread = threading.Thread(target=work, args=(index,), name=part.name, daemon=True)
                    thread.start()
                    running[index] = thread
                index += 1
                publish()
            with contextlib.suppress(queue.Empty):  # a timeout keeps signals prompt on any platform
                i, row, end_s = finished.get(timeout=1.0)
                end(i, row, end_s)
                say(f"{parts[i].name}: {row['status']}")
                publish()
    except BaseException:  # an interrupt, or a fault of this script: no part may outlive the run
        stop.set()
        for i in running:
            done[i] = {"part": parts[i].name, "status": "interrupted"}
        with contextlib.suppress(OSError):
            publish()  # marked before the wait, in case a second signal cuts it short
        for thread in running.values():
            thread.join(timeout=args.grace + 5)  # run_commands kills its group at once on `stop`
        while not finished.empty():  # parts that ended on their own just before the interrupt
            i, row, end_s = finished.get_nowait()
            if row["status"] != "interrupted":
                end(i, row, end_s)
        publish()
        raise


def main(argv: Optional[List[str]] = None) -> int:
    """Run the acceptance parts; 0 when the script worked (see the table for the parts), 1 interrupted, 2 bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("out", "work", "data_root"):
        setattr(args, name, os.path.abspath(getattr(args, name)))
    if PACKAGE_ERROR is not None:
        print(f"error: reid_engine does not import ({PACKAGE_ERROR}); only the env part runs:", flush=True)
        subprocess.run([sys.executable, "-c", ENV_PROBE], cwd=REPO)
        return 1
    if args.write_teacher:
        write_teacher(args.write_teacher, args.data_root, args.tiny)
        return 0
    if args.device == "cpu" and not args.tiny:
        print("note: --device cpu without --tiny trains full-size models on the CPU (slow)", flush=True)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")
    try:
        caps = parse_caps(args.caps)
        parts = select_parts(build_parts(args), args.parts)
    except ValueError as e:
        parser.error(str(e))
    if args.list:
        for part in parts:
            print(f"{part.name} ({'shared' if part.shared else 'alone'}, cap {cap_of(part.name, caps):.0f} s)"
                  f"{': ' + part.skip if part.skip else ''}")
            for command in part.commands:
                print("    " + shlex.join(command))
        return 0
    out = args.out
    archive = os.path.abspath(args.archive or os.path.join(os.path.dirname(out), "acceptance_logs.tar.gz"))
    for name in ("logs", "runs"):
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        os.makedirs(os.path.join(out, name))
    meta = {"command": sys.argv[1:] if argv is None else list(argv), "budget_s": args.budget, "jobs": args.jobs,
            "caps": caps, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "finished": False}
    packer = Packer(out, archive, args.pack_every).start()
    rows: List[dict] = []
    status = 0
    try:
        with sigterm_raises():
            run_all(parts, args, out, caps, meta, rows)
        meta["finished"] = True
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"interrupted ({e or 'SIGINT'}): results so far in {out}", flush=True)
        status = 1
    finally:
        write_results(out, rows, meta)
        packer.stop()
    print("\n" + format_table(rows))
    print(f"\nresults: {os.path.join(out, 'results.json')}; logs: {archive}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
