"""The training engine: the loop, hooks, and (from defaults/launch) the ready-made trainer."""
from .defaults import *  # noqa: F401,F403
from .hooks import *  # noqa: F401,F403
from .launch import *  # noqa: F401,F403
from .train_loop import *  # noqa: F401,F403
