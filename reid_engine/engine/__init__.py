"""The training engine: the loop, hooks, and (from defaults/launch) the ready-made trainer.

`default_argument_parser` lives in the command-line layer (`reid_engine.cli.args`); it stays
importable from here for detectron2-style scripts, imported on first use, since cli sits above engine.
"""
from .defaults import *  # noqa: F401,F403
from .hooks import *  # noqa: F401,F403
from .launch import *  # noqa: F401,F403
from .train_loop import *  # noqa: F401,F403

#: names that moved up to `reid_engine.cli` and are still importable from here
_FROM_CLI = ("default_argument_parser",)
# `from reid_engine.engine import *` goes on giving every public name, the forwarded ones included.
__all__ = sorted(name for name in globals() if not name.startswith("_")) + list(_FROM_CLI)


def __getattr__(name: str):
    """Import a name of `_FROM_CLI` from `reid_engine.cli.args` when first asked for."""
    if name not in _FROM_CLI:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ..cli import args  # lazy: engine must not import cli while it is itself being imported

    value = getattr(args, name)
    globals()[name] = value  # later look-ups find it directly
    return value


def __dir__():
    """The module's names, the ones forwarded to `reid_engine.cli` included."""
    return sorted(set(globals()) | set(_FROM_CLI))
