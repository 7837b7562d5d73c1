"""Keep the calling thread's alternate signal stack across calls into native code that replaces it.

OpenVINO's CPU plugin installs an alternate signal stack of about 11 KB on the thread that
compiles a model (``sigaltstack``). CPython runs its signal handlers with ``SA_ONSTACK``, so
the next Python-handled signal on that thread (SIGCHLD, which torch's DataLoader handles
when a worker process ends; SIGTERM; ...) runs on that small stack, and the dynamic linker's
lazy symbol resolution inside the handler can overflow it: the process dies of SIGSEGV,
intermittently. `preserved_signal_stack` puts back the stack the thread had before (none,
or faulthandler's larger one).
"""
import contextlib
import ctypes
import sys
from typing import Iterator, Optional

__all__ = ["preserved_signal_stack", "current_signal_stack"]


class _StackT(ctypes.Structure):
    """``stack_t`` of Linux (glibc and musl): pointer, flags, size."""

    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _libc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc if hasattr(libc, "sigaltstack") else None
    except OSError:
        return None


#: ``SS_DISABLE`` of <signal.h>: the thread has no alternate signal stack
_SS_DISABLE = 2


def _read_stack(libc: Optional[ctypes.CDLL]) -> Optional[_StackT]:
    """The calling thread's alternate signal stack, or None where it cannot be read."""
    stack = _StackT()
    return stack if libc is not None and libc.sigaltstack(None, ctypes.byref(stack)) == 0 else None


def current_signal_stack() -> Optional[tuple]:
    """(address, flags, size) of the calling thread's alternate signal stack, or None where
    it cannot be read (not Linux)."""
    stack = _read_stack(_libc())
    return (stack.ss_sp, stack.ss_flags, stack.ss_size) if stack is not None else None


@contextlib.contextmanager
def preserved_signal_stack() -> Iterator[None]:
    """Restore the calling thread's alternate signal stack when the block ends (a no-op where
    it cannot be read). The stack the block installed is not freed: its owner may still
    point other threads or its own handlers at it."""
    libc = _libc()
    saved = _read_stack(libc)
    if saved is None:
        yield
        return
    try:
        yield
    finally:
        now = _read_stack(libc)
        if now is not None and (now.ss_sp, now.ss_size) != (saved.ss_sp, saved.ss_size):
            # SS_ONSTACK is a state, not a flag one may set; SS_DISABLE stays as it was.
            restore = _StackT(saved.ss_sp, saved.ss_flags & _SS_DISABLE, saved.ss_size)
            libc.sigaltstack(ctypes.byref(restore), None)
