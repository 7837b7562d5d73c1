"""The defaults a training script needs: setup, writers, DefaultTrainer (the argument parser is cli.args's).

`DefaultTrainer` wires the ReID pieces together in the usual way; its `build_*`
classmethods are the override points for research code.
"""
import logging
import os
import sys
import weakref
from collections import OrderedDict
from typing import Dict, List, Optional

import torch

from ..config import CfgNode
from ..data import DevicePrefetcher, build_batch_augmentation, build_reid_test_loader, build_reid_train_loader
from ..data.pseudo_labels import build_pseudo_train_loader
from ..evaluation import (
    DatasetEvaluator,
    ExpectedResultsError,
    ReidEvaluator,
    inference_on_dataset,
    log_result_checks,
    print_csv_format,
)
from ..inference.rank_vis import RANK_VIS_FILE, write_rank_vis
from ..integrations.mlflow import MLflowWriter
from ..modeling import build_model
from ..reliability.preemption import TrainingPreempted, requested_signal
from ..runtime import compile_cost
from ..runtime.compiled import is_compiled
from ..runtime.run_plan import RunPlan, build_run_plan, freezes_layers
from ..solver import build_lr_scheduler, build_optimizer
from ..utils import comm
from ..utils.checkpoint import Checkpointer
from ..utils.errors import UsageError
from ..utils.logger import setup_logger
from . import hooks, scaling
from .ddp import create_ddp_model, model_device
from .hooks import CompileGuard
from .hooks.pseudo_labels import PseudoLabeler
from .setup import default_setup, default_writers
from .train_loop import AMPTrainer, SimpleTrainer, TrainerBase
from .trainer_base import TrainingStopped

__all__ = [
    "default_setup",
    "default_writers",
    "create_ddp_model",
    "DefaultTrainer",
]

logger = logging.getLogger(__name__)

MLFLOW_ARTIFACTS = ("config.yaml", "metrics.json", RANK_VIS_FILE, "log.txt")  # a run's files in its MLflow run


def stopped_on_purpose() -> bool:
    """Whether the training now ending was stopped on purpose (a stop signal, a pruned trial), not by a failure."""
    return isinstance(sys.exc_info()[1], (TrainingPreempted, TrainingStopped)) or bool(requested_signal())

#: iterations between log lines / metric writes, and between loss fetches from the device
LOG_PERIOD = 20
#: an extra metric write (log line with losses and ETA, metrics.json record) at this iteration:
#: the first one the IterationTimer times, so a fresh run shows its ETA long before LOG_PERIOD
EARLY_LOG_ITER = hooks.TIMER_WARMUP_ITERS


class DefaultTrainer(TrainerBase):
    """A trainer with the standard ReID training logic.

    It builds the train loader, fills MODEL.HEADS.NUM_CLASSES from the training set,
    builds model, optimizer, LR scheduler (epochs converted to iterations), checkpointer
    and the default hooks, and wraps the model in DDP for several workers. Override the
    `build_*` classmethods to change a piece; subclass `build_hooks` to add hooks.

    Example:
        trainer = DefaultTrainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        trainer.train()
    """

    def __init__(self, cfg: CfgNode):
        super().__init__()
        root_logger = logging.getLogger("reid_engine")
        if not root_logger.isEnabledFor(logging.INFO):
            setup_logger()
        cfg = self.auto_scale_workers(cfg, comm.get_world_size())
        # Device, precision, layout, compilation, batched augmentation and loader workers: decided once here.
        self.plan = self.build_run_plan(cfg)
        self.plan.apply_threads()

        data_loader = self.build_train_loader(cfg)
        cfg = self.auto_scale_hyperparams(cfg, data_loader.dataset.num_classes,
                                          getattr(data_loader.dataset, "num_cameras", 0))
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        model = create_ddp_model(model)
        device = model_device(model)  # the plan's, unless an overridden build_model placed it elsewhere
        if device.type == "cuda":
            data_loader = DevicePrefetcher(data_loader, device)

        trainer_cls = AMPTrainer if self.plan.amp is not None else SimpleTrainer
        # Losses are fetched from the device once per logging period, not every step.
        trainer_kwargs = {"gather_metric_period": LOG_PERIOD,
                          "batch_augment": self.build_batch_augmentation(cfg, data_loader, device)}
        if self.plan.amp is not None:
            trainer_kwargs["precision"] = self.plan.amp
        self._trainer = trainer_cls(model, data_loader, optimizer, **trainer_kwargs)
        # Runs the compiled steps: auto falls back to eager on a compile error, a recompile storm or
        # a compiled step slower than eager; an explicit MODEL.COMPILE mode fails in one line instead.
        self.compile_guard = self.build_compile_guard(self.plan, model, cfg)
        self._trainer.compile_guard = self.compile_guard

        self.iters_per_epoch = self.compute_iters_per_epoch(cfg, len(data_loader.dataset))
        self.scheduler = self.build_lr_scheduler(cfg, optimizer, self.iters_per_epoch)
        # The trainer's whole state (iteration, optimizer, scheduler via its hook,
        # scaler, hook states, RNG, data stream, event histories) is one checkpointable.
        # A distillation model keeps its teachers (and EMA state) out of its state_dict, so the
        # student's files load into a plain Baseline; they are checkpointed beside it.
        teachers = getattr(comm.unwrap_model(model), "teacher_state", None)
        extra = {"teachers": teachers} if teachers is not None else {}
        self.checkpointer = Checkpointer(model, cfg.OUTPUT_DIR, trainer=weakref.proxy(self), **extra)
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_EPOCH * self.iters_per_epoch
        self.cfg = cfg
        self.register_hooks(self.build_hooks())
        # The inner trainer runs the step, so it must see the same hooks (after_backward).
        self._trainer._hooks = self._hooks

    # ------------------------------------------------------------------ state
    def resume_or_load(self, resume: bool = True) -> None:
        """Resume from OUTPUT_DIR/last_checkpoint, or load MODEL.WEIGHTS.

        Args:
            resume: with a `last_checkpoint` present, restore model, optimizer,
                scheduler, scaler, hook states, RNG, data stream and iteration and
                continue at the next iteration (MODEL.WEIGHTS is then ignored).
                Otherwise only MODEL.WEIGHTS (when set) is loaded and training
                starts at iteration 0.

        A checkpoint of another number of workers continues exactly when this run has
        its global batch (the loader's state checks it; ``TrainLoader.load_state_dict``),
        else the load raises one ``ConfigError`` line before training.
        """
        self.checkpointer.resume_or_load(self.cfg.MODEL.WEIGHTS, resume=resume)
        if resume and self.checkpointer.has_checkpoint():
            self.start_iter = self.iter + 1

    def state_dict(self) -> dict:
        """Iteration, hook states and event histories, plus the inner trainer's
        optimizer, RNG, data-stream and scaler states."""
        ret = super().state_dict()
        inner = self._trainer.state_dict()
        for shared in ("iteration", "hooks", "storage"):  # already saved above
            inner.pop(shared, None)
        ret["_trainer"] = inner
        return ret

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._trainer.load_state_dict({**state_dict["_trainer"], "iteration": state_dict["iteration"]})

    # ------------------------------------------------------------------ loop
    @property
    def model(self):
        return self._trainer.model

    @property
    def optimizer(self):
        return self._trainer.optimizer

    @property
    def data_loader(self):
        return self._trainer.data_loader

    def restart_data_stream(self) -> None:
        """Make the next step iterate the data loader afresh (see SimpleTrainer.restart_data_stream)."""
        self._trainer.restart_data_stream()

    def run_step(self) -> None:
        self._trainer.iter = self.iter
        self._trainer.run_step()
        if self.iter in (EARLY_LOG_ITER, self.max_iter - 1):
            # On every worker (a collective), so the early and the last log lines show the
            # losses of their own iteration; the writer itself runs on the main worker only.
            self.flush_metrics()

    def flush_metrics(self) -> None:
        """Fetch, check and write the losses the step trainer staged on the device."""
        self._trainer.flush_metrics()

    def step_may_be_long(self) -> bool:
        """The step trainer's (SimpleTrainer.step_may_be_long)."""
        return self._trainer.step_may_be_long()

    def step_snapshot(self):
        """The step trainer's (SimpleTrainer.step_snapshot)."""
        return self._trainer.step_snapshot()

    def train(self) -> Optional[Dict]:
        """Train from `start_iter` to `max_iter`; verify TEST.EXPECTED_RESULTS.

        Returns:
            the last evaluation results on the main process (else None).
        """
        complete = self.start_iter >= self.max_iter  # --resume of a finished run
        if complete and not self._final_evaluation_pending():
            final = os.path.join(self.cfg.OUTPUT_DIR, "model_final.pth")
            raise UsageError(f"nothing to train: the run in {self.cfg.OUTPUT_DIR} is already complete (iteration "
                             f"{self.start_iter} of {self.max_iter}); to train longer, --resume with a larger "
                             f"SOLVER.MAX_EPOCH (now {self.cfg.SOLVER.MAX_EPOCH}); to evaluate it, --eval-only "
                             f"MODEL.WEIGHTS {final}")
        if complete:
            logger.info("The run is complete but a stop signal cut its final evaluation short: evaluating it now")
        super().train(self.start_iter, self.max_iter, hooks_only=complete)
        return self._checked_results()

    def _final_evaluation_pending(self) -> bool:
        """Whether the run's final evaluation was cut short by a stop (its EvalHook's state)."""
        return any(isinstance(h, hooks.EvalHook) and h.pending == self.max_iter - 1 for h in self._hooks)

    def _checked_results(self) -> Optional[Dict]:
        """The last evaluation results, checked against TEST.EXPECTED_RESULTS on the main process."""
        results = getattr(self, "_last_eval_results", None)
        if len(self.cfg.TEST.EXPECTED_RESULTS) and comm.is_main_process():
            if results is None:
                raise RuntimeError("TEST.EXPECTED_RESULTS is set but no evaluation ran during training.")
            self.check_expected_results(self.cfg, results)
        return results

    @classmethod
    def check_expected_results(cls, cfg: CfgNode, results: Dict) -> None:
        """Raise when the results miss TEST.EXPECTED_RESULTS, so the command exits non-zero.

        Raises:
            ExpectedResultsError: one line naming each missed metric, by how much and the tolerance.
        """
        failures = log_result_checks(cfg, results)
        if failures:
            raise ExpectedResultsError("TEST.EXPECTED_RESULTS not met: " + "; ".join(failures)
                                       + ": look at the evaluation above, or change the expectation")

    def build_hooks(self) -> List[hooks.HookBase]:
        """The default hooks, in order: pseudo labels (PSEUDO.ENABLED), timer, LR scheduler, compile guard,
        the CPU thread budget (the plan's "threads follow the load"),
        EMA teacher, PreciseBN, LayerFreeze, evaluation, best checkpoint, writers, periodic checkpoints,
        preemption (SIGTERM / SIGUSR1 / SIGINT: checkpoint and stop).

        The periodic checkpoint comes last so that the state it saves already holds
        this iteration's evaluation and best metric, and writers run before it so a
        crash between the two repeats a metrics line rather than losing one.

        Returns:
            list of hooks (None entries are dropped by register_hooks).
        """
        cfg = self.cfg.clone()
        cfg.defrost()
        ipe = self.iters_per_epoch
        ret: List[Optional[hooks.HookBase]] = [hooks.IterationTimer(sync_period=LOG_PERIOD), hooks.LRScheduler(),
                                               self.compile_guard]
        if self.plan.adapt_threads:
            ret.append(hooks.ThreadBudgetHook(self.plan.threads))
        if cfg.PSEUDO.ENABLED:  # first, so the clustering time stays out of the iteration times
            loader = getattr(self.data_loader, "loader", self.data_loader)  # under a DevicePrefetcher
            ret.insert(0, PseudoLabeler(self.cfg, loader, cfg.PSEUDO.PERIOD * ipe))
        if getattr(comm.unwrap_model(self.model), "has_ema_teacher", False):
            ret.append(hooks.EMATeacher(self.model))

        if cfg.TEST.PRECISE_BN.ENABLED:
            ret.append(
                hooks.PreciseBN(
                    cfg.TEST.EVAL_PERIOD * ipe,
                    self.model,
                    self.build_precise_bn_loader(cfg),
                    cfg.TEST.PRECISE_BN.NUM_ITER,
                )
            )
        if freezes_layers(cfg):
            ret.append(hooks.LayerFreeze(self.model, cfg.MODEL.FREEZE_LAYERS, cfg.SOLVER.FREEZE_ITERS))

        def test_and_save_results():
            final = self.iter >= self.max_iter  # EvalHook.after_train of a completed run
            # Under auto a compile error in evaluation falls back to eager and evaluates again.
            self._last_eval_results = self.compile_guard.evaluate(lambda: self.test(self.cfg, self.model, final=final))
            return self._last_eval_results

        eval_period = cfg.TEST.EVAL_PERIOD * ipe
        ret.append(hooks.EvalHook(eval_period, test_and_save_results))
        if comm.is_main_process() and len(cfg.DATASETS.TESTS) > 0:
            ret.append(
                hooks.BestCheckpointer(eval_period, self.checkpointer, f"{cfg.DATASETS.TESTS[0]}/metric", "max")
            )
        if comm.is_main_process():
            ret.append(hooks.PeriodicWriter(self.build_writers(), period=LOG_PERIOD, early_iter=EARLY_LOG_ITER))
        # On every worker (only the main one writes files): before a save it fetches the staged
        # losses, a collective, and the preemption hook stops all workers at the same step.
        periodic = hooks.PeriodicCheckpointer(self.checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD * ipe,
                                              max_to_keep=cfg.SOLVER.CHECKPOINT_MAX_TO_KEEP or None)
        ret += [periodic, hooks.Preemption(periodic)]
        return ret

    def build_writers(self) -> list:
        """The event writers (console, metrics.json, tensorboard; MLflow with MLFLOW.ENABLED, main process)."""
        writers = default_writers(self.cfg.OUTPUT_DIR, self.max_iter, self.plan.device)
        if self.cfg.MLFLOW.ENABLED and comm.is_main_process():
            trainer = weakref.proxy(self)  # the writer asks at its first write whether this run resumed
            writers.append(MLflowWriter(self.cfg, self.max_iter, resumed=lambda: trainer.start_iter > 0,
                                        stopped_on_purpose=stopped_on_purpose, artifacts=MLFLOW_ARTIFACTS))
        return writers

    # ------------------------------------------------------------------ builders
    @classmethod
    def build_run_plan(cls, cfg: CfgNode) -> RunPlan:
        """Decide how this process trains `cfg` (device, precision, layout, compilation, batched
        augmentation, loader workers); logged once as a table. Override to change a decision."""
        return build_run_plan(cfg, purpose="train")

    @classmethod
    def build_compile_guard(cls, plan: RunPlan, model: torch.nn.Module, cfg: Optional[CfgNode] = None) -> CompileGuard:
        """The guard that runs the (compiled) steps and evaluations, with the plan's compile mode;
        with `cfg`, it keeps and reads the compile record of this recipe (``runtime.compile_cost``),
        weighs the compile cost under auto unless MODEL.COMPILE_WEIGH_COST is off, and knows when
        frozen layers are released (SOLVER.FREEZE_ITERS)."""
        mode = plan.compile_mode if is_compiled(model) else "off"  # an overridden build_model may not compile
        recipe = ""
        if cfg is not None and mode != "off":
            detail = (f"input {tuple(cfg.INPUT.SIZE_TRAIN)}, batch {cfg.SOLVER.IMS_PER_BATCH // comm.get_world_size()}, "
                      f"autocast {plan.autocast_dtype}, channels_last {plan.channels_last}")
            recipe = compile_cost.recipe_key(model, plan.device, detail)
        weigh = bool(cfg.MODEL.COMPILE_WEIGH_COST) if cfg is not None else True
        # The release LayerFreeze gets from build_hooks: the same cfg (FREEZE_ITERS already scaled to the workers).
        frozen_until = int(cfg.SOLVER.FREEZE_ITERS) if cfg is not None and freezes_layers(cfg) else 0
        return CompileGuard(model, mode, explicit=plan.compile_explicit, recipe=recipe, weigh_cost=weigh,
                            frozen_until=frozen_until)

    @classmethod
    def build_model(cls, cfg: CfgNode, plan: Optional[RunPlan] = None) -> torch.nn.Module:
        """Build the model from MODEL.* as the run plan says (default: :meth:`build_run_plan`'s);
        override to use your own."""
        return build_model(cfg, plan if plan is not None else cls.build_run_plan(cfg))

    @classmethod
    def build_optimizer(cls, cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:
        """Build the optimizer from SOLVER.*."""
        return build_optimizer(cfg, model)

    @classmethod
    def build_lr_scheduler(cls, cfg: CfgNode, optimizer, iters_per_epoch: int):
        """Build the per-iteration LR scheduler from SOLVER.*."""
        return build_lr_scheduler(cfg, optimizer, iters_per_epoch)

    @classmethod
    def build_train_loader(cls, cfg: CfgNode):
        """Build the training loader over DATASETS.NAMES (with PSEUDO.ENABLED, the label-free one)."""
        logger.info("Prepare training set")
        if cfg.PSEUDO.ENABLED:
            return build_pseudo_train_loader(cfg)
        return build_reid_train_loader(cfg)

    @classmethod
    def build_batch_augmentation(cls, cfg: CfgNode, data_loader, device: torch.device):
        """The batched flip / pad-crop / erasing the step applies on ``device`` (INPUT.DEVICE_AUGMENT),
        seeded from the loader's stream seed and the rank, or None (the loader's workers apply them)."""
        stream = data_loader.state_dict() if hasattr(data_loader, "state_dict") else {}
        seed = int(stream.get("seed", max(int(cfg.SEED), 0)))
        return build_batch_augmentation(cfg, device, seed, rank=comm.get_rank())

    @classmethod
    def build_precise_bn_loader(cls, cfg: CfgNode):
        """A training-style loader over TEST.PRECISE_BN.DATASET for PreciseBN (its batches are
        augmented per image: the hook feeds them to the model as they come)."""
        cfg = cfg.clone()
        cfg.defrost()
        cfg.DATASETS.NAMES = (cfg.TEST.PRECISE_BN.DATASET,)
        cfg.INPUT.DEVICE_AUGMENT = "off"
        return build_reid_train_loader(cfg)

    @classmethod
    def build_test_loader(cls, cfg: CfgNode, dataset_name: str):
        """Build the test loader of one test set; returns (loader, num_query)."""
        return build_reid_test_loader(cfg, dataset_name)

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str, num_query: int, output_dir=None) -> DatasetEvaluator:
        """Build the evaluator of one test set."""
        return ReidEvaluator(cfg, num_query, output_dir)

    @classmethod
    def test(cls, cfg: CfgNode, model, evaluators=None, final: bool = False) -> "OrderedDict[str, Dict[str, float]]":
        """Evaluate `model` on every DATASETS.TESTS set, one by one.

        Args:
            cfg: the config.
            model: the model (DDP-wrapped or not).
            evaluators: None to build ReidEvaluators, or one evaluator (or list) per set.
            final: the run's last evaluation (end of training, --eval-only): with
                TEST.RANK_VIS, OUTPUT_DIR/ranks.png is drawn from the first set's features.
        Returns:
            OrderedDict {dataset name: {metric: value}} (empty on non-main workers).
        """
        if isinstance(evaluators, DatasetEvaluator):
            evaluators = [evaluators]
        if evaluators is not None and len(cfg.DATASETS.TESTS) != len(evaluators):
            raise ValueError(f"{len(cfg.DATASETS.TESTS)} test sets but {len(evaluators)} evaluators were given.")
        results = OrderedDict()
        for idx, dataset_name in enumerate(cfg.DATASETS.TESTS):
            logger.info(f"Prepare testing set {dataset_name}")
            data_loader, num_query = cls.build_test_loader(cfg, dataset_name)
            evaluator = evaluators[idx] if evaluators is not None else cls.build_evaluator(cfg, dataset_name, num_query)
            results_i = inference_on_dataset(model, data_loader, evaluator, flip_test=cfg.TEST.FLIP.ENABLED)
            if comm.is_main_process():
                if not isinstance(results_i, dict):
                    raise TypeError(f"Evaluator must return a dict on the main process, got {results_i!r}.")
                print_csv_format({dataset_name: results_i} if _is_flat(results_i) else results_i)
                results[dataset_name] = results_i
                if final and idx == 0 and cfg.TEST.RANK_VIS:
                    write_rank_vis(cfg, dataset_name, evaluator)
        return results

    # ------------------------------------------------------------------ scaling
    @staticmethod
    def compute_iters_per_epoch(cfg: CfgNode, num_train_images: int) -> int:
        """Iterations per epoch (see :func:`engine.scaling.iters_per_epoch`)."""
        return scaling.iters_per_epoch(cfg, num_train_images)

    @staticmethod
    def auto_scale_hyperparams(cfg: CfgNode, num_classes: int, num_cameras: int = 0) -> CfgNode:
        """A frozen copy of `cfg` with NUM_CLASSES (and NUM_CAMERAS) from the training set
        (see :func:`engine.scaling.scale_to_training_set`)."""
        return scaling.scale_to_training_set(cfg, num_classes, num_cameras)

    @staticmethod
    def auto_scale_workers(cfg: CfgNode, num_workers: int) -> CfgNode:
        """`cfg` scaled to `num_workers` against SOLVER.REFERENCE_WORLD_SIZE
        (see :func:`engine.scaling.scale_to_world_size`)."""
        return scaling.scale_to_world_size(cfg, num_workers)


def _is_flat(results: dict) -> bool:
    return all(not isinstance(v, dict) for v in results.values())
