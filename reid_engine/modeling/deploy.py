"""Deploy-time fusion of re-parameterisable blocks, whatever the backbone family.

Some blocks train with several parallel branches that fold into one layer for inference
(RepVGG's 3x3 + 1x1 + identity into one 3x3 conv). Such a module offers a hook

    def fuse_for_deploy(self) -> bool

that folds its own branches in place (using the norms' running statistics, i.e. the
eval-mode computation), returns True when it changed and False when it already was in
deploy form, and raises a ReidUserError when it cannot be folded. The hook handles only
the module's own branches, never another module that has a hook: `fuse_for_deploy`
below visits every module. A new family only adds the hook to its block.
"""
import logging
from collections import Counter

from torch import nn

__all__ = ["DEPLOY_HOOK", "fuse_for_deploy", "has_deploy_hooks"]

logger = logging.getLogger(__name__)

#: name of the per-module fusion hook
DEPLOY_HOOK = "fuse_for_deploy"


def has_deploy_hooks(model: nn.Module) -> bool:
    """True when some module of `model` has a `fuse_for_deploy()` hook (fused or not)."""
    return any(callable(getattr(module, DEPLOY_HOOK, None)) for module in model.modules())


def fuse_for_deploy(model: nn.Module) -> nn.Module:
    """Fuse every module of `model` that has a `fuse_for_deploy()` hook, in place.

    The fused model computes what `model` computed in eval mode (within float rounding)
    with fewer, plainer layers; it is meant for inference and export. A state dict saved
    afterwards holds the fused layout (for RepVGG: `rbr_reparam.weight` / `.bias`); it
    loads into a fused model and into one built from the same config, which switches the
    blocks it finds fused. Logs how many blocks were fused, by type.

    Args:
        model: any module; models without hooks are returned unchanged.
    Returns:
        `model` itself.
    Raises:
        ReidUserError: a block cannot be fused (e.g. its norm is GroupNorm); blocks
            visited before it are already fused, so fuse a copy when that matters.
    """
    fused = Counter()
    for module in list(model.modules()):  # a list: hooks replace submodules
        hook = getattr(module, DEPLOY_HOOK, None)
        if callable(hook) and hook():
            fused[type(module).__name__] += 1
    if fused:
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(fused.items()))
        logger.info("Fused %d blocks for deployment (%s)", sum(fused.values()), kinds)
    else:
        logger.info("Fused 0 blocks for deployment: %s has no unfused blocks", type(model).__name__)
    return model
