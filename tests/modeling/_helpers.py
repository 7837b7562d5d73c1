"""Shared helpers of the modeling tests: small configs, a loss run on two gloo workers."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reid_engine.config import get_cfg


def tiny_cfg(depth="18x", **overrides):
    """A CPU config for a small ResNet model with 64x32 test images.

    Args:
        depth: MODEL.BACKBONE.DEPTH.
        overrides: flat "SECTION.KEY" (under MODEL.) -> value, e.g. {"HEADS.WITH_BNNECK": True}.
    """
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.HEADS.NUM_CLASSES = 5
    cfg.INPUT.SIZE_TEST = [64, 32]
    cfg.INPUT.SIZE_TRAIN = [64, 32]
    for key, value in overrides.items():
        node = cfg.MODEL
        *path, leaf = key.split(".")
        for part in path:
            node = getattr(node, part)
        setattr(node, leaf, value)
    return cfg


def _loss_worker(rank, init_file, loss_fn, feats, targets, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        local = feats.chunk(2)[rank].clone().requires_grad_()
        loss, module = loss_fn(local, targets.chunk(2)[rank])
        loss.backward()
        state = module.state_dict() if module is not None else {}
        torch.save({"loss": loss.detach(), "grad": local.grad, "state": state}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_loss_on_two_workers(loss_fn, feats, targets, tmp_path):
    """Run ``loss_fn(local_feats, local_targets) -> (loss, module or None)`` on two gloo workers, each with half the batch.

    ``loss_fn`` must be a module-level function (picklable for spawn). Returns, per rank,
    ``{"loss", "grad" (of its half), "state" (the module's state dict after backward)}``.
    """
    # fork: the workers reuse the imported torch instead of importing it again (seconds); but a
    # process that has initialised CUDA (other tests on a GPU machine) cannot be forked safely.
    start_method = "spawn" if torch.cuda.is_initialized() else "fork"
    mp.start_processes(_loss_worker, nprocs=2, join=True, start_method=start_method,
                       args=(str(tmp_path / "init"), loss_fn, feats, targets, str(tmp_path)))
    return [torch.load(tmp_path / f"{rank}.pt") for rank in range(2)]
