"""preserved_signal_stack: the calling thread's alternate signal stack survives native code that replaces it."""
import ctypes
import sys

import pytest

from reid_engine.reliability.signal_stack import _StackT, current_signal_stack, preserved_signal_stack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack is read through Linux's libc")


def test_a_stack_installed_inside_the_block_is_replaced_by_the_one_before():
    libc = ctypes.CDLL(None, use_errno=True)
    before = current_signal_stack()
    small = ctypes.create_string_buffer(16384)  # what a native library might install
    with preserved_signal_stack():
        stack = _StackT(ctypes.addressof(small), 0, ctypes.sizeof(small))
        assert libc.sigaltstack(ctypes.byref(stack), None) == 0
        assert current_signal_stack()[2] == 16384
    assert current_signal_stack() == before


def test_an_unchanged_stack_is_left_alone():
    before = current_signal_stack()
    with preserved_signal_stack():
        pass
    assert current_signal_stack() == before
