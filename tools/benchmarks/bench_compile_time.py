#!/usr/bin/env python
"""Benchmark torch.compile's cost per shipped model family: whole model against repeated blocks.

For each family (a shipped config at its real input size) and MODEL.COMPILE_SCOPE (``model``: one
graph; ``blocks``: the repeated blocks, what ``auto`` picks), a fresh process builds the model on
the CPU, compiles it (MODEL.COMPILE default: inductor, or --backend aot_eager: dynamo and
AOTAutograd alone) into an empty cache folder and times SGD training steps on a small batch. The
compile seconds are the first compiled step (the backward graph compiles in it too) minus the
median steady step; a second process on the filled cache gives the "warm" figure, what a second
run of the same recipe pays. The CPU shows the device-independent part (tracing, the joint graph,
lowering and scheduling); on a GPU, Triton kernels replace the C++ build. Rounds take turns family
by family, scope by scope. E.g. ``--backend aot_eager --no-warm`` (the front half alone).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from families import FAMILIES as ALL_FAMILIES
from harness import REPO, Stopwatch, print_table

HERE = os.path.dirname(os.path.abspath(__file__))
#: the families its image training step can run: no tracklets, no teacher files to write first
FAMILIES = {family.name: family for family in ALL_FAMILIES if not family.video and not family.teacher}

# What one measurement process runs (argv: config, scope, batch, steps, overrides as JSON).
_CHILD = r"""
import json, statistics, sys
import torch
from harness import random_batch, timed, train_step
torch.set_num_threads(int(sys.argv[6]))
from reid_engine.config import get_cfg
from reid_engine.modeling import build_model
from reid_engine.runtime.run_plan import build_run_plan
config, scope, batch, steps, overrides = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
cfg = get_cfg()
cfg.merge_from_file(config)
cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.BACKBONE.PRETRAIN", "False", "MODEL.HEADS.NUM_CLASSES", "32",
                     "MODEL.COMPILE", "default", "MODEL.COMPILE_SCOPE", scope, "SOLVER.AMP.ENABLED", "False",
                     "MODEL.COMPILE_BACKEND", sys.argv[7], "MODEL.CHANNELS_LAST", "off"] + overrides)
model = build_model(cfg, build_run_plan(cfg, log=False)).train()
data = {**random_batch(batch, 2, *cfg.INPUT.SIZE_TRAIN), "camids": torch.zeros(batch, dtype=torch.long)}
(first, *rest), _ = timed(train_step(model, torch.optim.SGD(model.parameters(), lr=1e-3), data), repeats=steps + 1)
steady = statistics.median(rest)
graphs = len(torch._dynamo.utils.get_compilation_metrics())
print("RESULT " + json.dumps({"first_s": first, "steady_s": steady, "compile_s": max(0.0, first - steady),
                              "graphs": graphs, "blocks": len(getattr(model, "compiled_regions", []) or [])}))
"""


def measure(config: str, scope: str, overrides, args, cache_dir: str) -> dict:
    """One fresh process compiling `config` with `scope` into `cache_dir`; its RESULT line as a dict."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONPATH=os.pathsep.join([REPO, HERE]))
    with Stopwatch() as watch:
        proc = subprocess.run([sys.executable, "-c", _CHILD, os.path.join(REPO, config), scope, str(args.batch),
                               str(args.steps), json.dumps(list(overrides)), str(args.threads), args.backend],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:200], "wall_s": watch.wall}
    return {**json.loads(lines[-1][len("RESULT "):]), "wall_s": watch.wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--scopes", nargs="+", default=["model", "blocks"], choices=["model", "blocks"])
    parser.add_argument("--rounds", type=int, default=1, help="cold measurements per family and scope")
    parser.add_argument("--batch", type=int, default=4, help="images per step (pairs of one identity)")
    parser.add_argument("--steps", type=int, default=2, help="steady compiled steps after the first")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the measured process")
    parser.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"],
                        help="aot_eager: dynamo and AOTAutograd only (the device-independent front half)")
    parser.add_argument("--no-warm", action="store_true", help="skip the second (warm-cache) process")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)

    rows = {}
    for round_index in range(args.rounds):
        for family in args.families:
            config, overrides = FAMILIES[family].config, FAMILIES[family].extra
            for scope in args.scopes:
                with tempfile.TemporaryDirectory(prefix="inductor-cache-", ignore_cleanup_errors=True) as cache:
                    cold = measure(config, scope, overrides, args, cache)
                    warm = {} if args.no_warm or "error" in cold else measure(config, scope, overrides, args, cache)
                rows.setdefault((family, scope), []).append((cold, warm))
                print(f"round {round_index + 1} {family:18s} {scope:6s} cold {cold.get('compile_s', float('nan')):7.1f} s  warm "
                      f"{warm.get('compile_s', float('nan')):6.1f} s  graphs {cold.get('graphs', '-')}  {cold.get('error', '')}",
                      flush=True)

    def median(family, scope, which):
        values = [pair[which]["compile_s"] for pair in rows.get((family, scope), []) if "compile_s" in pair[which]]
        return statistics.median(values) if values else None

    def text(value):
        return "-" if value is None else f"{value:.1f}"

    out = [{"family": family, **{f"{scope}_{which}_s": median(family, scope, index) for scope in ("model", "blocks")
                                 for index, which in enumerate(("cold", "warm"))}} for family in args.families]
    print()
    print_table(("family", "whole model: cold s", "blocks: cold s", "reduction", "whole model: warm s", "blocks: warm s"),
                ((r["family"], text(r["model_cold_s"]), text(r["blocks_cold_s"]),
                  f"{r['model_cold_s'] / r['blocks_cold_s']:.1f}x" if r["model_cold_s"] and r["blocks_cold_s"] else "-",
                  text(r["model_warm_s"]), text(r["blocks_warm_s"])) for r in out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": out, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
