"""Convolutions whose bfloat16 weight gradient on the CPU is one matrix product.

oneDNN's bfloat16 weight-gradient kernel is slow on small feature maps: for a 3x3 convolution
with 256 channels on a 6x3 map (the main job's layer4, batch 64) it took 16.0 ms on this
project's Xeon (AMX), slower than float32's, against 3.2 ms as an unfolded matrix product
(im2col, then one GEMM, which AMX runs at full speed). On larger maps oneDNN wins again (a 3x3
convolution on 24x12 with 32 channels: 1.4 ms against 2.6 ms), so the matrix product is used
only below the sizes in `uses_matmul_weight_grad`. The forward pass and the input gradient
stay oneDNN's; the weight gradient rounds the same way as oneDNN's (the products accumulate
in float32, the result is bfloat16), with the same error against a float32 reference.
Figures per layer shape and for the main job's step (1.29x): tools/benchmarks/bench_cpu_bf16_conv.py.
"""
import torch
import torch.nn.functional as F
from torch import nn

# Output positions per image (H x W) up to which the matrix product beat oneDNN's bfloat16
# weight gradient in every shape measured: 1x1 convolutions up to 72 (12x6), larger kernels up
# to 128 (16x8; a 1x1 convolution there gained nothing: 0.87-1.02x).
MAX_POSITIONS_1X1 = 72
MAX_POSITIONS = 128


def _pair(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def cpu_bf16_autocast() -> bool:
    """Whether bfloat16 autocast is on for the CPU here."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    return torch.is_autocast_cpu_enabled() and torch.get_autocast_cpu_dtype() == torch.bfloat16


def output_positions(height: int, width: int, kernel_size, stride, padding) -> int:
    """H_out x W_out of a convolution (dilation 1) on an `height` x `width` input."""
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel_size), _pair(stride), _pair(padding)
    return ((height + 2 * ph - kh) // sh + 1) * ((width + 2 * pw - kw) // sw + 1)


def uses_matmul_weight_grad(conv: nn.Conv2d, x: torch.Tensor) -> bool:
    """Whether `conv` applied to `x` takes the matrix-product weight gradient: bfloat16
    autocast on the CPU while gradients are recorded, a plain convolution (one group, no
    dilation, zero padding given as numbers), and a small output map."""
    if not (x.device.type == "cpu" and x.dim() == 4 and torch.is_grad_enabled() and conv.weight.requires_grad
            and cpu_bf16_autocast()):
        return False
    if conv.groups != 1 or conv.dilation != (1, 1) or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        return False
    positions = output_positions(x.shape[2], x.shape[3], conv.kernel_size, conv.stride, conv.padding)
    return positions <= (MAX_POSITIONS_1X1 if conv.kernel_size == (1, 1) else MAX_POSITIONS)


def matmul_weight_grad(grad_out: torch.Tensor, x: torch.Tensor, kernel_size, stride, padding) -> torch.Tensor:
    """The weight gradient of a convolution (one group, dilation 1) as one matrix product.

    Args:
        grad_out: (N, O, H_out, W_out), the gradient of the convolution's output.
        x: (N, C, H, W), the convolution's input.
        kernel_size, stride, padding: the convolution's (int or pair).

    Returns:
        (O, C, kh, kw), in x's dtype.
    """
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel_size), _pair(stride), _pair(padding)
    n, c = x.shape[:2]
    h_out, w_out = grad_out.shape[2:]
    # Channels last, padded: each kernel offset is then a strided window over the same storage,
    # and the patches of all offsets (im2col) come out in one copy.
    padded = F.pad(x.permute(0, 2, 3, 1), (0, 0, pw, pw, ph, ph)).contiguous()
    hp, wp = padded.shape[1:3]
    patches = padded.as_strided((n, h_out, w_out, kh, kw, c),
                                (hp * wp * c, sh * wp * c, sw * c, wp * c, c, 1)).reshape(n * h_out * w_out, kh * kw * c)
    grad_rows = grad_out.permute(0, 2, 3, 1).reshape(n * h_out * w_out, -1)
    return (grad_rows.t() @ patches).view(-1, kh, kw, c).permute(0, 3, 1, 2)


class _MatmulWeightGradConv2d(torch.autograd.Function):
    """conv2d (one group, dilation 1) whose backward computes the weight gradient with
    `matmul_weight_grad` and the input gradient with aten's kernel."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding):
        ctx.save_for_backward(x, weight)
        ctx.stride, ctx.padding, ctx.has_bias = stride, padding, bias is not None
        return F.conv2d(x, weight, bias, stride, padding)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
                grad_out, x, weight, None, list(ctx.stride), list(ctx.padding), [1, 1], False, [0, 0], 1,
                [True, False, False])[0]
        if ctx.needs_input_grad[1]:
            # Laid out channels last; AccumulateGrad gives the parameter's .grad the parameter's layout.
            grad_w = matmul_weight_grad(grad_out, x, weight.shape[2:], ctx.stride, ctx.padding)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_out.sum((0, 2, 3))
        return grad_x, grad_w, grad_b, None, None


class MatmulGradConv2d(nn.Conv2d):
    """nn.Conv2d that takes the matrix-product weight gradient where
    `uses_matmul_weight_grad` says so, and is a plain nn.Conv2d everywhere else (float32,
    evaluation, GPUs). Same parameters and state_dict keys as nn.Conv2d."""

    def forward(self, x):
        if torch.jit.is_scripting():  # TorchScript export: the plain convolution
            return self._conv_forward(x, self.weight, self.bias)
        return self._python_forward(x)

    @torch.jit.unused
    def _python_forward(self, x):
        if not uses_matmul_weight_grad(self, x):
            return self._conv_forward(x, self.weight, self.bias)
        # What autocast would do for conv2d: both operands (and the bias) in bfloat16.
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        with torch.autocast("cpu", enabled=False):
            return _MatmulWeightGradConv2d.apply(x.to(torch.bfloat16), self.weight.to(torch.bfloat16), bias,
                                                 self.stride, self.padding)


def convert_to_matmul_grad_convs(module: nn.Module) -> nn.Module:
    """Turn every nn.Conv2d in `module` (itself included) into a MatmulGradConv2d, in place;
    returns `module`."""
    if type(module) is nn.Conv2d:
        # A class swap keeps the very same Parameters, buffers and hooks (as nn.Conv2d's
        # subclasses share its state layout), so optimizers and DDP built later see no change.
        module.__class__ = MatmulGradConv2d
        return module
    for child in module.children():
        convert_to_matmul_grad_convs(child)
    return module
