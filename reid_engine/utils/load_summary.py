"""The one readable report of how a state dict fitted a model: tensors loaded, skipped for
their shape, missing and unused, with keys grouped by module and long lists cut short."""
import itertools
from collections import defaultdict
from typing import Dict, Iterable, List, Tuple

import torch

__all__ = ["format_load_summary", "drop_tied_aliases"]

# Longest list of key groups printed per category in the load summary.
_MAX_GROUPS_SHOWN = 20


def _group_keys(keys: Iterable[str]) -> List[str]:
    """Compact key groups: ``a.b.{bias, weight}`` for keys sharing a module prefix."""
    groups: Dict[str, List[str]] = {}
    for key in sorted(keys):
        head, _, tail = key.rpartition(".")
        groups.setdefault(head, []).append(tail)
    lines = []
    for head, tails in groups.items():
        if not head:
            lines.extend(tails)
        elif len(tails) == 1:
            lines.append(f"{head}.{tails[0]}")
        else:
            lines.append(f"{head}.{{{', '.join(tails)}}}")
    return lines


def _bounded(lines: List[str]) -> List[str]:
    if len(lines) <= _MAX_GROUPS_SHOWN:
        return lines
    return lines[:_MAX_GROUPS_SHOWN] + [f"... and {len(lines) - _MAX_GROUPS_SHOWN} more"]


def format_load_summary(
    source: str,
    num_model_keys: int,
    missing: List[str],
    unexpected: List[str],
    incorrect_shapes: List[Tuple[str, Tuple[int, ...], Tuple[int, ...]]],
) -> str:
    """One readable report of how a state dict fitted a model.

    Args:
        source: the file loaded (for the first line).
        num_model_keys: entries in the model's state dict.
        missing: model keys the checkpoint did not provide (shape-skipped ones excluded).
        unexpected: checkpoint keys the model does not have.
        incorrect_shapes: (key, checkpoint shape, model shape) for skipped entries.

    Returns:
        str: a multi-line message.
    """
    loaded = num_model_keys - len(missing) - len(incorrect_shapes)
    lines = [f"Loaded {loaded} of {num_model_keys} model tensors from {source}."]
    if incorrect_shapes:
        lines.append(f"Skipped {len(incorrect_shapes)} with a different shape (checkpoint vs model):")
        shown = [f"  {k}: {tuple(c)} vs {tuple(m)}" for k, c, m in sorted(incorrect_shapes)]
        lines.extend(_bounded(shown))
    if missing:
        lines.append(f"Not in the checkpoint, left as initialized ({len(missing)}):")
        lines.extend("  " + g for g in _bounded(_group_keys(missing)))
    if unexpected:
        lines.append(f"In the checkpoint but not used by the model ({len(unexpected)}):")
        lines.extend("  " + g for g in _bounded(_group_keys(unexpected)))
    return "\n".join(lines)


def drop_tied_aliases(model: torch.nn.Module, missing: List[str]) -> List[str]:
    """Drop missing names of tensors that were loaded under another name (tied weights).

    Args:
        model: the model loaded into.
        missing: the model keys the checkpoint did not provide.

    Returns:
        list: `missing` without the names whose tensor arrived under one of its other names.
    """
    names_of: Dict[int, List[str]] = defaultdict(list)
    named = itertools.chain(model.named_parameters(remove_duplicate=False),
                            model.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        names_of[id(tensor)].append(name)
    missing_set = set(missing)
    loaded_under_another_name = {
        name for names in names_of.values() if not missing_set.issuperset(names) for name in names}
    return [k for k in missing if k not in loaded_under_another_name]
