"""The two quantizers a Q/DQ pair becomes in the torch graph, what each learns, and how.

The weight quantizer (a weight's DQ(Q(W)), per-channel scales fixed as trtq computed them):
the level of each weight is ``floor(W / s) + h(V)``, ``h`` a rectified sigmoid in [0, 1] (AdaRound,
Nagel et al. 2020), ``V`` initialised so that ``h(V)`` is W's fractional part: the soft weight
starts as W itself and its hard rounding (``V >= 0``) as nearest rounding. :func:`rounding_penalty`
draws ``h`` to 0 or 1. Levels stay in [-127, 127], trtq's symmetric weight range.

The activation quantizer (an activation's DQ(Q(x)), symmetric per tensor, zero point 0, as
TensorRT runs it): ``s * clamp(round(x / s), -128, 127)`` with the rounding passed straight
through, so both x and the step ``s`` get LSQ's gradients (Esser et al. 2020); ``s`` is learned as
``s0 * exp(u)`` (u starts at 0: the cache's amax / 127). While training, each element keeps its
float value with probability ``drop`` (QDrop, Wei et al. 2022).
"""

from __future__ import annotations

import numpy as np

ZETA, GAMMA = 1.1, -0.1  # AdaRound's stretch of the sigmoid, so that h reaches 0 and 1 exactly
WEIGHT_QMAX = 127
ACT_QMIN, ACT_QMAX = -128, 127  # what QuantizeLinear to int8 saturates at


def _make_classes():
    """Define the torch modules (torch is imported only here, on first use)."""
    import torch

    nn = torch.nn

    class _WeightQuantizer(nn.Module):
        def __init__(self, weight: np.ndarray, scale: np.ndarray, axis, name: str, device):
            super().__init__()
            w = torch.as_tensor(np.array(weight, np.float32), device=device)
            s = torch.as_tensor(np.array(scale, np.float32), device=device)
            if s.dim() == 1 and w.dim() > 1:
                shape = [1] * w.dim()
                shape[axis % w.dim()] = -1
                s = s.reshape(shape)
            self.name = name
            self.register_buffer("w", w)
            self.register_buffer("s", s)
            scaled = w / s
            self.register_buffer("floor", torch.floor(scaled))
            rest = (scaled - self.floor).clamp(0.0, 1.0)
            # h(V) = rest at the start: sigmoid(V) = (rest - gamma) / (zeta - gamma)
            p = ((rest - GAMMA) / (ZETA - GAMMA)).clamp(1e-4, 1 - 1e-4)
            self.v = nn.Parameter(torch.log(p / (1 - p)))
            self.mode = "float"  # float | nearest | soft | hard

        def h(self):
            return torch.clamp(torch.sigmoid(self.v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)

        def levels(self):
            """Integer levels of the hard rounding (float tensor)."""
            return torch.clamp(self.floor + (self.v >= 0).to(self.w.dtype), -WEIGHT_QMAX, WEIGHT_QMAX)

        def nearest_levels(self):
            return torch.clamp(torch.round(self.w / self.s), -WEIGHT_QMAX, WEIGHT_QMAX)

        def forward(self):
            if self.mode == "float":
                return self.w
            if self.mode == "soft":
                return torch.clamp(self.floor + self.h(), -WEIGHT_QMAX, WEIGHT_QMAX) * self.s
            if self.mode == "hard":
                return self.levels() * self.s
            return self.nearest_levels() * self.s

    class _ActivationQuantizer(nn.Module):
        def __init__(self, scale: float, tensor: str, device):
            super().__init__()
            self.tensor = tensor
            self.register_buffer("base", torch.tensor(float(scale), dtype=torch.float32, device=device))
            self.u = nn.Parameter(torch.zeros((), dtype=torch.float32, device=device))
            self.register_buffer("zero", torch.zeros(1, dtype=torch.float32, device=device))
            self.enabled = False
            self.drop = 0.0
            self.generator = None

        def scale(self):
            return self.base * torch.exp(self.u)

        def forward(self, x):
            if not self.enabled or not x.is_floating_point():
                return x
            s = self.scale()
            if not torch.is_grad_enabled():  # as QuantizeLinear computes it: round(x / s), saturated
                return torch.clamp(torch.round(x / s), ACT_QMIN, ACT_QMAX) * s
            # torch's fused fake quantizer with LSQ's gradient for the step (rounding passed through)
            y = torch._fake_quantize_learnable_per_tensor_affine(x, s.reshape(1), self.zero, ACT_QMIN, ACT_QMAX, 1.0)
            if self.training and self.drop > 0:
                keep = torch.rand(x.shape, generator=self.generator, device=x.device) < self.drop
                y = torch.where(keep, x, y)
            return y

    return _WeightQuantizer, _ActivationQuantizer


_CLASSES = None


def classes():
    """(WeightQuantizer, ActivationQuantizer), the torch modules."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _make_classes()
    return _CLASSES


def rounding_penalty(quantizers, beta: float):
    """AdaRound's regulariser ``sum(1 - |2 h - 1| ** beta)`` over every weight of ``quantizers``,
    divided by their count (0 when every h is 0 or 1)."""
    import torch

    total, count = None, 0
    for q in quantizers:
        term = (1 - (2 * q.h() - 1).abs().pow(beta)).sum()
        total = term if total is None else total + term
        count += q.v.numel()
    return total / count if count else torch.zeros(())
