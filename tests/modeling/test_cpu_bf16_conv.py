"""The CPU bfloat16 convolution whose weight gradient is one matrix product: the gradient is
the convolution's, the path is taken only where it is meant to be, and converting a model
changes no parameter, key or output."""
import copy

import pytest
import torch
from torch import nn

from reid_engine.modeling.layers.cpu_bf16_conv import (
    MatmulGradConv2d,
    convert_to_matmul_grad_convs,
    matmul_weight_grad,
    uses_matmul_weight_grad,
)

# (in, out, kernel, stride, padding, input H x W)
SHAPES = [(8, 16, 3, 1, 1, (6, 3)), (8, 16, 3, 2, 1, (7, 5)), (4, 6, 1, 1, 0, (6, 3)), (4, 6, 1, 2, 0, (6, 4)),
          (3, 8, 7, 2, 3, (12, 8)), (5, 7, (3, 1), (2, 1), (1, 0), (9, 4))]


@pytest.mark.parametrize("cin, cout, kernel, stride, padding, size", SHAPES)
def test_matmul_weight_grad_is_the_convolution_weight_gradient(cin, cout, kernel, stride, padding, size):
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False).double()
    x = torch.randn(3, cin, *size, dtype=torch.float64)
    out = conv(x)
    grad_out = torch.randn_like(out)
    (expected,) = torch.autograd.grad(out, conv.weight, grad_out)
    for layout in (torch.contiguous_format, torch.channels_last):
        got = matmul_weight_grad(grad_out.contiguous(memory_format=layout), x.contiguous(memory_format=layout),
                                 conv.kernel_size, conv.stride, conv.padding)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def _train_step(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().square().mean().backward()
    return out


@pytest.mark.parametrize("bias", [False, True])
def test_bf16_training_matches_autocast_conv2d(bias):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(16, 32, 3, 1, 1, bias=bias), nn.ReLU(), nn.Conv2d(32, 32, 3, 2, 1, bias=bias))
    fast = convert_to_matmul_grad_convs(copy.deepcopy(plain))
    x = torch.randn(8, 16, 6, 4)
    x_plain, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.testing.assert_close(_train_step(fast, x_fast), _train_step(plain, x_plain), rtol=0, atol=0)
    for got, expected in zip(fast.parameters(), plain.parameters()):
        assert got.grad.dtype == torch.float32 and got.grad.stride() == got.stride()  # the parameter's layout
        # both round bfloat16 products accumulated in float32: equal up to bfloat16 rounding
        torch.testing.assert_close(got.grad, expected.grad, rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(x_fast.grad, x_plain.grad, rtol=0, atol=0)  # aten's own input gradient


def test_the_matmul_path_is_taken_only_in_cpu_bf16_training_on_small_maps():
    conv = MatmulGradConv2d(4, 4, 3, padding=1)
    small, large = torch.randn(2, 4, 12, 6), torch.randn(2, 4, 24, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert uses_matmul_weight_grad(conv, small)
        assert not uses_matmul_weight_grad(conv, large)  # 288 positions: oneDNN is faster there
        assert not uses_matmul_weight_grad(MatmulGradConv2d(4, 4, 1), torch.randn(2, 4, 16, 8))  # 1x1 on 128
        assert not uses_matmul_weight_grad(MatmulGradConv2d(4, 4, 3, padding=1, groups=2), small)
        assert not uses_matmul_weight_grad(MatmulGradConv2d(4, 4, 3, padding=2, dilation=2), small)
        with torch.no_grad():
            assert not uses_matmul_weight_grad(conv, small)  # evaluation
    assert not uses_matmul_weight_grad(conv, small)  # float32
    conv.weight.requires_grad_(False)  # a frozen layer
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not uses_matmul_weight_grad(conv, small)


def test_converting_keeps_parameters_keys_eval_outputs_and_scripting():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Sequential(nn.Conv2d(8, 8, 1)))
    params, keys = list(model.parameters()), list(model.state_dict())
    x = torch.randn(2, 3, 6, 3)
    expected = model.eval()(x)
    assert convert_to_matmul_grad_convs(model) is model
    assert isinstance(model[0], MatmulGradConv2d) and isinstance(model[2][0], MatmulGradConv2d)
    assert all(a is b for a, b in zip(model.parameters(), params))  # an optimizer built before still works
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.jit.script(model)(x), expected, rtol=0, atol=0)  # TorchScript export
