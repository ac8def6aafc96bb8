#!/usr/bin/env python3
"""Export trtq's model zoo: small random-weight vision models, each at two opsets, plus a manifest.

Runs in a torch environment (torch, torchvision, timm, onnx, onnxscript; onnxruntime to check
each file), not in trtq's: see scripts/zoo_env.sh. trtq itself never imports torch.

    python scripts/export_zoo.py                 # the whole zoo into .zoo/
    python scripts/export_zoo.py --fast          # the CI subset
    python scripts/export_zoo.py --only resnet18,crnn_tnc --out /tmp/zoo

Each architecture is exported twice: the TorchScript exporter (``dynamo=False``) at opset 13 and
the dynamo exporter at opset 17. Where an exporter fails on a model (or writes a file that ONNX
Runtime cannot run or that disagrees with torch), the next pair of its slot is tried and the
manifest records the failure and the pair used instead.

Weights are random (torch's default initialisation, seeded per model), so files are deterministic
for a given torch / torchvision / timm. The batch dim is dynamic (``N``); inputs are small.

manifest.json, one entry per file: the architecture, source (torchvision / timm / own), opset,
exporter, the input (name, shape with ``N`` for the batch, layout, a shape to feed), and for each
output the compare task a correct tool infers:

* ``classify``: ``[N, C]`` class scores;
* ``segment`` with ``layout`` ``NCHW`` or ``NHWC``: per-pixel class maps (or a 1-channel map);
* ``ctc`` with ``layout`` ``NTC`` or ``TNC``: per-time-step class scores, class 0 the blank;
* ``detect`` with ``layout`` ``split``: separate box and score outputs; ``role`` is ``boxes`` or
  ``scores``, ``pair`` names the other output of the same anchors, ``box_format`` how the boxes
  decode (``dfl``; null for anchor regressions, which need anchors no flag gives), ``stride``,
  ``box_encoding`` in words;
* ``raw``: nothing in the graph says what the output is; a correct tool says it cannot tell.

``sqnr_min_db`` (where present, with ``sqnr_why``) is an output's own SQNR bound where the
random-weight model amplifies quantization noise past the tests' default (measured, not guessed).
``auto`` (where present) lists what compare's inference may answer instead of the task: split heads
may be ``raw`` as long as the reason names the ``--task`` flags that would score them.

A file whose manifest entry (its spec: builder, shapes, seed, package versions) is unchanged and
whose bytes still match the recorded sha256 is skipped, so a second run does nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
ZOO_FORMAT = 3  # bump when a builder changes: every file's spec changes, so all are re-exported
SEED = 28
# (exporter, opset) of the two slots, then what each slot falls back to, in order
SLOTS = {
    "ts13": [("torchscript", 13), ("torchscript", 14), ("dynamo", 18)],
    "dy17": [("dynamo", 17), ("dynamo", 18), ("torchscript", 17)],
}
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
EXAMPLE_BATCH = 2  # torch.export treats a size-1 dim as static: export at 2, check at 3
CHECK_BATCH = 3
CHECK_RTOL = 2e-3  # max |onnx - torch| / max |torch|: exporters reorder float sums, nothing more


# ---------------------------------------------------------------------------------------------
# own modules: written for the zoo where torchvision and timm have nothing fitting
# ---------------------------------------------------------------------------------------------


def conv_bn(
    cin: int, cout: int, k: int = 3, s: int = 1, groups: int = 1, act: Callable | None = nn.ReLU
) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act() if act is not nn.PReLU else nn.PReLU(cout))
    return nn.Sequential(*layers)


class MnistCNN(nn.Module):
    """LeNet-like classifier of 1-channel 28x28 digits."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):
        return self.head(self.features(x))


class CRNN(nn.Module):
    """Text-line recogniser: conv trunk on a 1 x 32 x W crop, bidirectional LSTM over the W/4 columns,
    Linear to blank + 36 characters, then LogSoftmax (TNC, time-major LSTM) or Softmax (NTC,
    batch-first LSTM) over the classes."""

    def __init__(self, layout: str, classes: int = 37, hidden: int = 64) -> None:
        super().__init__()
        self.layout = layout
        self.trunk = nn.Sequential(
            conv_bn(1, 32),
            nn.MaxPool2d(2),
            conv_bn(32, 64),
            nn.MaxPool2d(2),
            conv_bn(64, 96),
            nn.MaxPool2d((2, 1)),
            conv_bn(96, 128),
        )
        self.rnn = nn.LSTM(128, hidden, bidirectional=True, batch_first=layout == "NTC")
        self.fc = nn.Linear(2 * hidden, classes)
        self.norm = nn.LogSoftmax(dim=-1) if layout == "TNC" else nn.Softmax(dim=-1)

    def forward(self, x):
        f = self.trunk(x).mean(dim=2)  # [N, 128, T]
        seq = f.permute(2, 0, 1) if self.layout == "TNC" else f.permute(0, 2, 1)
        out, _ = self.rnn(seq)
        return self.norm(self.fc(out))


class NhwcClassifier(nn.Module):
    """A Keras-converted-style classifier: NHWC input through a Transpose, PReLU activations,
    depthwise-separable blocks, global pool, Softmax over the classes."""

    def __init__(self, classes: int = 12) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(3, 16, s=2, act=nn.PReLU),
            conv_bn(16, 16, groups=16, act=nn.PReLU),
            conv_bn(16, 32, k=1, act=nn.PReLU),
            conv_bn(32, 32, s=2, groups=32, act=nn.PReLU),
            conv_bn(32, 64, k=1, act=nn.PReLU),
            conv_bn(64, 64, s=2, groups=64, act=nn.PReLU),
            conv_bn(64, 96, k=1, act=nn.PReLU),
        )
        self.fc = nn.Linear(96, classes)

    def forward(self, x):
        y = self.body(x.permute(0, 3, 1, 2))
        return torch.softmax(self.fc(y.mean(dim=(2, 3))), dim=-1)


class NhwcSegNet(nn.Module):
    """A Keras-converted-style segmenter: NHWC in, NHWC class probabilities out (Softmax over the
    last axis after a Transpose back to channels-last); PReLU, a ConvTranspose decoder with skips."""

    def __init__(self, classes: int = 6) -> None:
        super().__init__()
        self.enc1 = conv_bn(3, 16, s=2, act=nn.PReLU)
        self.enc2 = conv_bn(16, 32, s=2, act=nn.PReLU)
        self.mid = conv_bn(32, 32, act=nn.PReLU)
        self.up2 = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec2 = conv_bn(32, 16, act=nn.PReLU)
        self.up1 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.cls = nn.Conv2d(16, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x.permute(0, 3, 1, 2))
        m = self.mid(self.enc2(e1))
        d2 = self.dec2(torch.cat([self.up2(m), e1], dim=1))
        logits = self.cls(self.up1(d2))
        return torch.softmax(logits.permute(0, 2, 3, 1), dim=-1)


class UNetSmall(nn.Module):
    """UNet-like: three levels, ConvTranspose upsampling, skip concats, a Sigmoid probability map."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        w = width
        self.e1 = nn.Sequential(conv_bn(3, w), conv_bn(w, w))
        self.e2 = nn.Sequential(nn.MaxPool2d(2), conv_bn(w, 2 * w), conv_bn(2 * w, 2 * w))
        self.e3 = nn.Sequential(nn.MaxPool2d(2), conv_bn(2 * w, 4 * w), conv_bn(4 * w, 4 * w))
        self.u2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.d2 = nn.Sequential(conv_bn(4 * w, 2 * w), conv_bn(2 * w, 2 * w))
        self.u1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.d1 = nn.Sequential(conv_bn(2 * w, w), conv_bn(w, w))
        self.out = nn.Conv2d(w, 1, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        c = self.e3(b)
        d = self.d2(torch.cat([self.u2(c), b], dim=1))
        e = self.d1(torch.cat([self.u1(d), a], dim=1))
        return torch.sigmoid(self.out(e))


class GeluMLP(nn.Module):
    """A plain MLP on a flattened 3 x 32 x 32 image: Linear, GELU, LayerNorm."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(3 * 32 * 32, 256),
            nn.GELU(),
            nn.Linear(256, 256),
            nn.GELU(),
            nn.LayerNorm(256),
            nn.Linear(256, classes),
        )

    def forward(self, x):
        return self.net(x)


class TinyBackbone(nn.Module):
    """Stride 8 / 16 / 32 (/ 64) features from depthwise-separable hard-swish blocks."""

    def __init__(self, widths=(16, 32, 64, 96, 128), levels: int = 3) -> None:
        super().__init__()
        w = widths
        self.stem = nn.Sequential(conv_bn(3, w[0], s=2, act=nn.Hardswish), conv_bn(w[0], w[1], s=2, act=nn.Hardswish))
        self.stages = nn.ModuleList()
        cin = w[1]
        for i in range(levels):
            cout = w[min(2 + i, len(w) - 1)]
            self.stages.append(
                nn.Sequential(
                    conv_bn(cin, cin, s=2, groups=cin, act=nn.Hardswish),
                    conv_bn(cin, cout, k=1, act=nn.Hardswish),
                    conv_bn(cout, cout, groups=cout, act=nn.Hardswish),
                    conv_bn(cout, cout, k=1, act=nn.Hardswish),
                )
            )
            cin = cout
        self.channels = [w[min(2 + i, len(w) - 1)] for i in range(levels)]

    def forward(self, x):
        x = self.stem(x)
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats


class RetinaSplit(nn.Module):
    """SSD/RetinaNet-style detector without post-processing: FPN-lite over three levels, shared
    class and box towers, per level [N, A*C, H, W] and [N, A*4, H, W] flattened and concatenated
    to raw box regressions [N, anchors, 4] and Sigmoid class scores [N, anchors, C]."""

    def __init__(self, classes: int = 20, anchors: int = 3, width: int = 48) -> None:
        super().__init__()
        self.classes, self.anchors = classes, anchors
        self.backbone = TinyBackbone(levels=3)
        self.lateral = nn.ModuleList(nn.Conv2d(c, width, 1) for c in self.backbone.channels)
        self.cls_tower = nn.Sequential(conv_bn(width, width), conv_bn(width, width))
        self.box_tower = nn.Sequential(conv_bn(width, width), conv_bn(width, width))
        self.cls_out = nn.Conv2d(width, anchors * classes, 3, padding=1)
        self.box_out = nn.Conv2d(width, anchors * 4, 3, padding=1)

    def forward(self, x):
        c3, c4, c5 = self.backbone(x)
        p5 = self.lateral[2](c5)
        p4 = self.lateral[1](c4) + nn.functional.interpolate(p5, scale_factor=2.0, mode="nearest")
        p3 = self.lateral[0](c3) + nn.functional.interpolate(p4, scale_factor=2.0, mode="nearest")
        boxes, scores = [], []
        for p in (p3, p4, p5):
            n = p.shape[0]
            s = self.cls_out(self.cls_tower(p)).permute(0, 2, 3, 1).reshape(n, -1, self.classes)
            b = self.box_out(self.box_tower(p)).permute(0, 2, 3, 1).reshape(n, -1, 4)
            scores.append(s)
            boxes.append(b)
        return torch.cat(boxes, dim=1), torch.sigmoid(torch.cat(scores, dim=1))


class PicoDetHead(nn.Module):
    """Anchor-free per-stride head as PicoDet / NanoDet export it without post-processing: per
    stride a Sigmoid score map [N, HW, C] and a box distribution map [N, HW, 4 * (reg_max + 1)]
    (the distances to the four sides as reg_max + 1 bins each, softmaxed and integrated later);
    the score maps first, then the box maps."""

    def __init__(self, classes: int = 80, reg_max: int = 7, width: int = 64, strides: int = 4) -> None:
        super().__init__()
        self.classes, self.reg_max = classes, reg_max
        self.backbone = TinyBackbone(levels=strides)
        self.necks = nn.ModuleList(conv_bn(c, width, k=1, act=nn.Hardswish) for c in self.backbone.channels)
        self.towers = nn.ModuleList(
            nn.Sequential(
                conv_bn(width, width, groups=width, act=nn.Hardswish), conv_bn(width, width, k=1, act=nn.Hardswish)
            )
            for _ in range(strides)
        )
        self.cls = nn.ModuleList(nn.Conv2d(width, classes, 1) for _ in range(strides))
        self.reg = nn.ModuleList(nn.Conv2d(width, 4 * (reg_max + 1), 1) for _ in range(strides))

    def forward(self, x):
        scores, boxes = [], []
        for i, f in enumerate(self.backbone(x)):
            t = self.towers[i](self.necks[i](f))
            scores.append(torch.sigmoid(self.cls[i](t)).flatten(2).permute(0, 2, 1))
            boxes.append(self.reg[i](t).flatten(2).permute(0, 2, 1))
        return (*scores, *boxes)


class OutOnly(nn.Module):
    """torchvision's segmentation models return a dict: keep the 'out' tensor."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)["out"]


class Features(nn.Module):
    """A transformer's last hidden states [N, tokens, dim] (forward_features), no head."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net.forward_features(x)


# ---------------------------------------------------------------------------------------------
# the zoo
# ---------------------------------------------------------------------------------------------


def _tv(name: str, **kw) -> Callable[[], nn.Module]:
    def build():
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kw)

    return build


def _tv_seg(name: str, **kw) -> Callable[[], nn.Module]:
    def build():
        import torchvision

        return OutOnly(getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None, **kw))

    return build


def _fcn_resnet18() -> nn.Module:
    import torchvision
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.fcn import FCN, FCNHead

    trunk = torchvision.models.resnet18(weights=None, replace_stride_with_dilation=[False, False, False])
    body = IntermediateLayerGetter(trunk, return_layers={"layer4": "out"})
    return OutOnly(FCN(body, FCNHead(512, 21)))


def _timm(name: str, **kw) -> Callable[[], nn.Module]:
    def build():
        import timm

        return timm.create_model(name, pretrained=False, **kw)

    return build


def _swin_micro() -> nn.Module:
    from timm.models.swin_transformer import SwinTransformer

    return SwinTransformer(
        img_size=64,
        patch_size=4,
        window_size=4,
        embed_dim=32,
        depths=(2, 2, 2),
        num_heads=(2, 4, 8),
        num_classes=100,
        drop_path_rate=0.0,
    )


def _vit_dinov2_style() -> nn.Module:
    """timm's ViT-Tiny (a 14x14 position-embedding grid) with its position embedding resampled as
    DINOv2 does it, to whatever grid the input makes: bicubic without antialiasing (timm's own
    resample antialiases, which the TorchScript exporter cannot write), sizes taken from the
    tensor's shape in graph (Shape / Gather / Concat arithmetic into Resize)."""
    import math
    import types

    import timm

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, dynamic_img_size=True)

    def _pos_embed(self, x):  # x: [B, H, W, C] patch tokens (dynamic_img_size keeps them 2-D)
        b, h, w, c = x.shape
        n = self.pos_embed.shape[1] - 1
        m = int(math.sqrt(n))
        class_pos = self.pos_embed[:, 0]
        grid = self.pos_embed[:, 1:].reshape(1, m, m, c).permute(0, 3, 1, 2)
        grid = nn.functional.interpolate(
            grid, scale_factor=(float(h + 0.1) / m, float(w + 0.1) / m), mode="bicubic", antialias=False
        )
        grid = grid.permute(0, 2, 3, 1).reshape(1, -1, c)
        pos = torch.cat((class_pos.unsqueeze(0), grid), dim=1)
        tokens = torch.cat((self.cls_token.expand(b, -1, -1), x.reshape(b, -1, c)), dim=1)
        return self.pos_drop(tokens + pos)

    vit._pos_embed = types.MethodType(_pos_embed, vit)
    return vit


def _vit_features() -> nn.Module:
    import timm

    return Features(timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=64))


@dataclass
class Spec:
    name: str
    architecture: str
    source: str  # torchvision / timm / own
    builder: str  # what builds it, as text (part of the spec: a change re-exports)
    build: Callable[[], nn.Module]
    input_name: str
    input_shape: list  # "N" for the batch dim, other names for other dynamic dims
    layout: str
    example: list  # a concrete shape to feed (batch first)
    outputs: list  # [{"name", "task", ...}]
    patterns: list = field(default_factory=list)  # what quantizers trip on in it
    fast: bool = False
    constant_weights: bool = False  # weights as Constant nodes (as Paddle exports write them)
    notes: str = ""
    # output -> (SQNR bound in dB, why): where a correct quantizer cannot reach the tests' default
    # on this random-weight model (it amplifies noise: see RANDOM_NOISE_NOTE)
    sqnr_floor: dict = field(default_factory=dict)
    # leave constant subgraphs unfolded (TorchScript do_constant_folding=False, dynamo optimize=False):
    # the shape arithmetic stays in the graph for trtq's own folding
    no_folding: bool = False

    def dynamic(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.input_shape) if isinstance(d, str)}


# split heads: "detect" once paired, or "raw" saying which --task flags would pair them (the graph
# alone cannot tell which outputs go together, nor decode anchor regressions without their anchors)
SPLIT_AUTO = ["detect", "raw"]


RANDOM_NOISE_NOTE = (
    "random weights amplify noise: Gaussian noise at 40 dB SNR on the input comes out at {amp} dB on this "
    "output (torch, FP32); trtq (mse) measured {trtq} dB, stock ONNX Runtime quantize_static (per-channel, "
    "symmetric, MinMax / Percentile) {ort} dB"
)


def _floor(bound: float, amp: float, trtq: float, ort: float) -> tuple[float, str]:
    return bound, RANDOM_NOISE_NOTE.format(amp=amp, trtq=trtq, ort=ort)


def _cls(name: str = "logits") -> list:
    return [{"name": name, "task": "classify"}]


def _img(size: int, ch: int = 3) -> list:
    return ["N", ch, size, size]


def _ex(shape: list, batch: int = EXAMPLE_BATCH) -> list:
    return [batch if d == "N" else d for d in shape]


def zoo() -> list[Spec]:
    specs = [
        Spec(
            "resnet18",
            "ResNet-18",
            "torchvision",
            "torchvision.models.resnet18()",
            _tv("resnet18"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["residual Add", "MaxPool"],
        ),
        Spec(
            "mobilenet_v3_small",
            "MobileNetV3-Small",
            "torchvision",
            "torchvision.models.mobilenet_v3_small()",
            _tv("mobilenet_v3_small"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["hard-swish", "squeeze-excite (hard-sigmoid Mul)", "depthwise Conv"],
            fast=True,
        ),
        Spec(
            "regnet_x_400mf",
            "RegNetX-400MF",
            "torchvision",
            "torchvision.models.regnet_x_400mf()",
            _tv("regnet_x_400mf"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["grouped Conv"],
            sqnr_floor={"logits": _floor(6.0, 10.5, 7.5, "7.5 / 7.6")},
        ),
        Spec(
            "efficientnet_b0",
            "EfficientNet-B0",
            "torchvision",
            "torchvision.models.efficientnet_b0()",
            _tv("efficientnet_b0"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["SiLU", "squeeze-excite (Sigmoid Mul)", "depthwise Conv"],
            sqnr_floor={"logits": _floor(2.0, 20.4, 3.5, "0.3 / 1.2")},
        ),
        Spec(
            "convnext_atto",
            "ConvNeXt-Atto",
            "timm",
            "timm convnext_atto",
            _timm("convnext_atto"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["LayerNorm over channels", "GELU", "layer scale Mul", "7x7 depthwise Conv"],
        ),
        Spec(
            "vit_tiny_dynpos",
            "ViT-Tiny/16 (position embedding resampled in graph, DINOv2-style)",
            "timm",
            "timm vit_tiny_patch16_224(dynamic_img_size=True), DINOv2's interpolate_pos_encoding "
            "(offset 0.1), fed 64x64",
            _vit_dinov2_style,
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            [
                "attention MatMul",
                "LayerNorm",
                "GELU",
                "position-embedding arithmetic (14x14 grid resampled to the input's 4x4 in "
                "graph, Concat with the class token's)",
                "exported without the exporters' own folding (TorchScript "
                "do_constant_folding=False, dynamo optimize=False)",
            ],
            fast=True,
            no_folding=True,
        ),
        Spec(
            "deit_tiny_distilled",
            "DeiT-Tiny/16 distilled",
            "timm",
            "timm deit_tiny_distilled_patch16_224(img_size=64)",
            _timm("deit_tiny_distilled_patch16_224", img_size=64),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["attention MatMul", "LayerNorm", "class + distillation tokens", "two heads averaged"],
        ),
        Spec(
            "swin_micro",
            "Swin (micro: embed 32, depths 2-2-2, window 4)",
            "timm",
            "timm SwinTransformer(img_size=64, patch_size=4, window_size=4, embed_dim=32, depths=(2,2,2), "
            "num_heads=(2,4,8), num_classes=100)",
            _swin_micro,
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["shifted windows (Roll / Slice + Concat)", "relative position bias Gather", "patch merging", "LayerNorm"],
        ),
        Spec(
            "vit_features",
            "DeiT-Tiny/16 hidden states (no head)",
            "timm",
            "timm deit_tiny_patch16_224(img_size=64).forward_features",
            _vit_features,
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            [
                {
                    "name": "tokens",
                    "task": "raw",
                    "why": "[N, 17, 192] transformer hidden states from a LayerNorm: not class scores, not a "
                    "detector head, not CTC; nothing in the graph says how to score them",
                }
            ],
            ["attention MatMul", "a 3-D output a shape rule would call a detector head"],
        ),
        Spec(
            "deeplabv3_mobilenet_v3_large",
            "DeepLabV3 (MobileNetV3-Large)",
            "torchvision",
            "torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(num_classes=21)['out']",
            _tv_seg("deeplabv3_mobilenet_v3_large", num_classes=21, aux_loss=False),
            "input",
            _img(96),
            "NCHW",
            _ex(_img(96)),
            [{"name": "out", "task": "segment", "layout": "NCHW"}],
            ["ASPP with global pooling branch", "bilinear Resize", "dilated Conv", "hard-swish"],
            sqnr_floor={"out": _floor(4.0, 16.1, 5.0, "6.1 / 6.2")},
        ),
        Spec(
            "fcn_resnet18",
            "FCN (ResNet-18 trunk)",
            "torchvision",
            "torchvision FCN(IntermediateLayerGetter(resnet18, layer4), FCNHead(512, 21))['out']",
            _fcn_resnet18,
            "input",
            _img(96),
            "NCHW",
            _ex(_img(96)),
            [{"name": "out", "task": "segment", "layout": "NCHW"}],
            ["bilinear Resize to the input size", "Dropout in eval"],
        ),
        Spec(
            "retina_split",
            "SSD/RetinaNet-style split heads",
            "own",
            "RetinaSplit(classes=20, anchors=3)",
            RetinaSplit,
            "input",
            _img(96),
            "NCHW",
            _ex(_img(96)),
            [
                {
                    "name": "boxes",
                    "task": "detect",
                    "layout": "split",
                    "role": "boxes",
                    "pair": "scores",
                    "auto": SPLIT_AUTO,
                    "box_format": None,
                    "box_encoding": "raw anchor regressions (dx, dy, dw, dh) per anchor: "
                    "3 anchors x (12x12 + 6x6 + 3x3); no box format decodes them without the anchors",
                },
                {
                    "name": "scores",
                    "task": "detect",
                    "layout": "split",
                    "role": "scores",
                    "pair": "boxes",
                    "auto": SPLIT_AUTO,
                    "box_encoding": "Sigmoid class scores, 20 classes, no objectness",
                },
            ],
            ["FPN nearest Resize + Add", "shared heads", "Reshape/Concat over levels"],
        ),
        Spec(
            "picodet_head",
            "PicoDet/NanoDet-style anchor-free per-stride head",
            "own",
            "PicoDetHead(classes=80, reg_max=7, strides 8/16/32/64)",
            PicoDetHead,
            "image",
            _img(128),
            "NCHW",
            _ex(_img(128)),
            [
                {
                    "name": f"cls_s{s}",
                    "task": "detect",
                    "layout": "split",
                    "role": "scores",
                    "pair": f"box_s{s}",
                    "auto": SPLIT_AUTO,
                    "stride": s,
                    "box_encoding": f"Sigmoid class scores, 80 classes, stride {s}",
                }
                for s in (8, 16, 32, 64)
            ]
            + [
                {
                    "name": f"box_s{s}",
                    "task": "detect",
                    "layout": "split",
                    "role": "boxes",
                    "pair": f"cls_s{s}",
                    "auto": SPLIT_AUTO,
                    "stride": s,
                    "box_format": "dfl",
                    "reg_max": 7,
                    "box_encoding": f"distribution of 4 side distances (left, top, right, bottom) in strides from the "
                    f"cell centre, reg_max 7 (4 x 8 bins, softmax then expectation), stride {s}",
                }
                for s in (8, 16, 32, 64)
            ],
            ["weights as Constant nodes (Paddle-style)", "hard-swish", "eight outputs"],
            fast=True,
            constant_weights=True,
            sqnr_floor={
                "box_s32": _floor(8.0, 25.7, 9.5, "10.4 / 10.0"),
                "box_s64": _floor(5.0, 21.5, 6.8, "6.9 / 6.6"),
            },
        ),
        Spec(
            "crnn_tnc",
            "CRNN (Conv + BiLSTM + LogSoftmax), time-major",
            "own",
            "CRNN(layout='TNC', classes=37)",
            lambda: CRNN("TNC"),
            "image",
            [1, 1, 32, "W"],
            "NCHW",
            [1, 1, 32, 128],
            [{"name": "log_probs", "task": "ctc", "layout": "TNC", "classes": 37, "blank": 0}],
            ["LSTM", "fixed batch 1, dynamic width", "1-channel input"],
            fast=True,
            notes="fixed batch of 1 and a dynamic width (W/4 time steps), as the issue's recogniser",
        ),
        Spec(
            "crnn_ntc",
            "CRNN (Conv + BiLSTM + Softmax), batch-major",
            "own",
            "CRNN(layout='NTC', classes=37)",
            lambda: CRNN("NTC"),
            "image",
            ["N", 1, 32, 96],
            "NCHW",
            [EXAMPLE_BATCH, 1, 32, 96],
            [{"name": "probs", "task": "ctc", "layout": "NTC", "classes": 37, "blank": 0}],
            ["LSTM", "1-channel input"],
        ),
        Spec(
            "nhwc_prelu_cls",
            "Keras-style NHWC classifier with PReLU",
            "own",
            "NhwcClassifier(classes=12)",
            NhwcClassifier,
            "input",
            ["N", 64, 64, 3],
            "NHWC",
            [EXAMPLE_BATCH, 64, 64, 3],
            _cls("probs"),
            ["NHWC input Transpose", "PReLU", "depthwise Conv"],
        ),
        Spec(
            "nhwc_seg",
            "Keras-style NHWC segmenter (NHWC output maps)",
            "own",
            "NhwcSegNet(classes=6)",
            NhwcSegNet,
            "input",
            ["N", 64, 64, 3],
            "NHWC",
            [EXAMPLE_BATCH, 64, 64, 3],
            [{"name": "probs", "task": "segment", "layout": "NHWC", "classes": 6}],
            ["NHWC input and output Transposes", "PReLU", "ConvTranspose", "Softmax over the last axis"],
            fast=True,
        ),
        Spec(
            "mnist_cnn",
            "LeNet-style 1-channel 28x28 classifier",
            "own",
            "MnistCNN(classes=10)",
            MnistCNN,
            "input",
            _img(28, 1),
            "NCHW",
            _ex(_img(28, 1)),
            _cls(),
            ["1-channel input", "Gemm"],
            fast=True,
        ),
        Spec(
            "shufflenet_v2_x0_5",
            "ShuffleNetV2 x0.5",
            "torchvision",
            "torchvision.models.shufflenet_v2_x0_5()",
            _tv("shufflenet_v2_x0_5"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["channel shuffle (Reshape/Transpose)", "Split/Slice"],
        ),
        Spec(
            "densenet121",
            "DenseNet-121",
            "torchvision",
            "torchvision.models.densenet121()",
            _tv("densenet121"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["dense Concats", "BN-ReLU before Conv"],
        ),
        Spec(
            "squeezenet1_1",
            "SqueezeNet 1.1",
            "torchvision",
            "torchvision.models.squeezenet1_1()",
            _tv("squeezenet1_1"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["fire-module Concat", "Conv classifier + global pool"],
        ),
        Spec(
            "mnasnet0_5",
            "MnasNet 0.5",
            "torchvision",
            "torchvision.models.mnasnet0_5()",
            _tv("mnasnet0_5"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["depthwise Conv", "inverted residuals"],
            sqnr_floor={"logits": _floor(6.0, 11.0, 7.7, "7.5 / 7.7")},
        ),
        Spec(
            "googlenet",
            "GoogLeNet",
            "torchvision",
            "torchvision.models.googlenet(aux_logits=False)",
            _tv("googlenet", aux_logits=False, init_weights=True),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["inception Concats", "MaxPool ceil_mode"],
        ),
        Spec(
            "unet_small",
            "UNet-like (ConvTranspose decoder)",
            "own",
            "UNetSmall(width=16)",
            UNetSmall,
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            [{"name": "mask", "task": "segment", "layout": "NCHW", "classes": 1}],
            ["ConvTranspose", "skip Concats", "Sigmoid probability map"],
        ),
        Spec(
            "gelu_mlp",
            "GELU MLP",
            "own",
            "GeluMLP(classes=10)",
            GeluMLP,
            "input",
            _img(32),
            "NCHW",
            _ex(_img(32)),
            _cls(),
            ["Flatten + Gemm", "GELU (Erf)", "LayerNorm"],
        ),
        Spec(
            "mobilevit_xxs",
            "MobileViT-XXS",
            "timm",
            "timm mobilevit_xxs",
            _timm("mobilevit_xxs"),
            "input",
            _img(64),
            "NCHW",
            _ex(_img(64)),
            _cls(),
            ["unfold/fold Reshape+Transpose around attention", "SiLU"],
        ),
    ]
    names = [s.name for s in specs]
    assert len(names) == len(set(names)), names
    return specs


# ---------------------------------------------------------------------------------------------
# exporting and checking
# ---------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    import onnx

    found = {"torch": torch.__version__, "onnx": onnx.__version__}
    for mod in ("torchvision", "timm", "onnxscript"):
        with contextlib.suppress(ImportError):
            found[mod] = __import__(mod).__version__
    return found


def spec_key(spec: Spec, slot: str, vers: dict[str, str]) -> dict[str, Any]:
    """What decides a file's bytes: a change here re-exports it."""
    return {
        "format": ZOO_FORMAT,
        "slot": slot,
        "builder": spec.builder,
        "input_shape": spec.input_shape,
        "example": spec.example,
        "seed": model_seed(spec.name),
        "constant_weights": spec.constant_weights,
        "no_folding": spec.no_folding,
        "bn_passes": BN_PASSES,
        "versions": {k: vers.get(k) for k in ("torch", "torchvision", "timm", "onnxscript")},
    }


def model_seed(name: str) -> int:
    return SEED * 1_000_003 + zlib.crc32(name.encode())


BN_PASSES = 4  # batches of 8 that set the BatchNorm statistics


def build_model(spec: Spec) -> nn.Module:
    """The model with seeded random weights and, where it has BatchNorm, running statistics
    measured on seeded inputs. torch's init leaves BatchNorm an identity, and through a random
    MobileNetV3 the activations then shrink ~2x a block to 1e-10 (nothing trained looks like
    that); measured statistics keep every normalised activation at unit scale, as training does."""
    torch.manual_seed(model_seed(spec.name))
    model = spec.build().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one summation order: the same statistics on every run
        try:
            for m in norms:
                m.reset_running_stats()
                m.momentum = None  # a plain average over the passes
                m.train()
            with torch.no_grad():
                for k in range(BN_PASSES):
                    model(example_input(spec, [8, *spec.example[1:]], salt=100 + k))
        finally:
            torch.set_num_threads(threads)
            model.eval()
    return model


def example_input(spec: Spec, shape: list, salt: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(model_seed(spec.name) + salt)
    return torch.randn(*shape, generator=g).clamp(-2.5, 2.5)


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def export_one(model: nn.Module, spec: Spec, exporter: str, opset: int, path: Path) -> None:
    x = example_input(spec, spec.example)
    outs = [o["name"] for o in spec.outputs]
    dyn_in = spec.dynamic()
    with quiet():
        if exporter == "torchscript":
            axes = {spec.input_name: dyn_in}
            for o in spec.outputs:
                axes[o["name"]] = output_dynamic_axes(spec, o)
            torch.onnx.export(
                model,
                (x,),
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=[spec.input_name],
                output_names=outs,
                dynamic_axes=axes,
                do_constant_folding=not spec.no_folding,
            )
        else:
            dims = {i: torch.export.Dim(name, min=1 if name == "N" else 8, max=4096) for i, name in dyn_in.items()}
            if spec.name == "crnn_tnc":  # the width is 4x the time steps: say so, or export guards fail
                dims = {3: 4 * torch.export.Dim("T", min=4, max=1024)}
            program = torch.onnx.export(
                model,
                (x,),
                dynamo=True,
                opset_version=opset,
                input_names=[spec.input_name],
                output_names=outs,
                dynamic_shapes=({**dims},),
                external_data=False,
                optimize=not spec.no_folding,
                verbose=False,
            )
            program.save(str(path), external_data=False)


@contextlib.contextmanager
def quiet():
    """Exporters print progress and, on failure, whole graphs from C++: send fds 1 and 2 to a
    scratch file while one runs (the failure itself is recorded from the exception)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as scratch:
            os.dup2(scratch.fileno(), 1)
            os.dup2(scratch.fileno(), 2)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def output_dynamic_axes(spec: Spec, out: dict) -> dict[int, str]:
    """TorchScript's dynamic_axes for an output: the batch axis (and the time axis of the CRNNs)."""
    if spec.name == "crnn_tnc":
        return {0: "T"}
    if out.get("layout") == "TNC":
        return {1: "N"}
    return {0: "N"} if "N" in spec.input_shape else {}


def strip_stack_traces(model) -> None:
    """The dynamo exporter writes each node's Python stack trace (paths of the venv it ran in) into
    its metadata: drop them, so a file's bytes do not depend on where torch is installed."""
    for node in model.graph.node:
        keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        if len(keep) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(keep)


def weights_to_constants(model) -> None:
    """Move every initializer into a Constant node at the graph's start (Paddle's exports keep
    weights this way)."""
    from onnx import helper

    consts = [
        helper.make_node("Constant", [], [init.name], name=f"const_{i}", value=init)
        for i, init in enumerate(model.graph.initializer)
    ]
    del model.graph.initializer[:]
    nodes = consts + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def check_file(path: Path, model: nn.Module, spec: Spec) -> dict[str, Any]:
    """Full onnx.checker, then ONNX Runtime at the example shape and at another batch size (the
    dynamic batch must really be dynamic) against torch. Raises on any disagreement."""
    import numpy as np
    import onnx

    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    declared = {}
    for o in proto.graph.output:
        dims = [d.dim_param or d.dim_value or "?" for d in o.type.tensor_type.shape.dim]
        declared[o.name] = dims
    want = [o["name"] for o in spec.outputs]
    if list(declared) != want:
        raise RuntimeError(f"outputs are {list(declared)}, want {want}")
    shapes = [spec.example]
    if "N" in spec.input_shape:
        shapes.append(_ex(spec.input_shape, CHECK_BATCH))
    if spec.name == "crnn_tnc":
        shapes.append([1, 1, 32, 96])
    result: dict[str, Any] = {"declared_output_shapes": declared, "checked_shapes": shapes}
    try:
        import onnxruntime as ort
    except ImportError:
        result["onnxruntime"] = "not installed: checked by onnx.checker only"
        return result
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3  # the failure is raised below with its line; keep ORT's own log quiet
    ort.set_default_logger_severity(3)
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    worst = 0.0
    out_shapes = {}
    for shape in shapes:
        x = example_input(spec, shape)
        with torch.no_grad():
            ref = model(x)
        ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        run_opts = ort.RunOptions()
        run_opts.log_severity_level = 3
        try:
            got = sess.run(want, {spec.input_name: x.numpy()}, run_opts)
        except Exception as e:
            raise RuntimeError(f"onnxruntime fails at input {shape}: {_first_line(e)}") from None
        for name, r, g in zip(want, ref, got):
            r = r.numpy()
            if r.shape != g.shape:
                raise RuntimeError(f"output {name}: onnxruntime shape {g.shape} != torch {r.shape} at input {shape}")
            err = float(np.max(np.abs(r - g)) / (np.max(np.abs(r)) + 1e-12))
            if not np.isfinite(err) or err > CHECK_RTOL:
                raise RuntimeError(f"output {name}: onnxruntime differs from torch by {err:.2e} (relative) at {shape}")
            worst = max(worst, err)
            out_shapes.setdefault(name, []).append(list(g.shape))
    result.update(onnxruntime=ort.__version__, max_relative_error=worst, output_shapes=out_shapes)
    return result


def count_ops(path: Path) -> dict[str, int]:
    import onnx

    proto = onnx.load(str(path))
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def export_slot(spec: Spec, slot: str, out: Path, vers: dict[str, str], model: nn.Module) -> dict[str, Any]:
    attempts = []
    for exporter, opset in SLOTS[slot]:
        fname = f"{spec.name}.{'ts' if exporter == 'torchscript' else 'dy'}{opset}.onnx"
        final = out / fname
        tmp = out / f".{fname}.tmp"
        t0 = time.perf_counter()
        try:
            export_one(model, spec, exporter, opset, tmp)
            import onnx

            proto = onnx.load(str(tmp))
            strip_stack_traces(proto)
            if spec.constant_weights:
                weights_to_constants(proto)
            onnx.save(proto, str(tmp))
            check = check_file(tmp, model, spec)
        except Exception as e:  # an exporter's failure is data for the manifest, not a crash
            attempts.append({"exporter": exporter, "opset": opset, "error": _first_line(e)})
            if os.environ.get("ZOO_DEBUG"):
                traceback.print_exc()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            continue
        seconds = time.perf_counter() - t0
        os.replace(tmp, final)
        ops = count_ops(final)
        entry = {
            "file": fname,
            "name": spec.name,
            "builder": spec.builder,
            "slot": slot,
            "exporter": exporter,
            "opset": opset,
            "fallback": None
            if not attempts
            else {
                "wanted": {"exporter": SLOTS[slot][0][0], "opset": SLOTS[slot][0][1]},
                "failed": attempts,
                "used": {"exporter": exporter, "opset": opset},
            },
            **describe(spec),
            "weights": f"random, seed {model_seed(spec.name)}"
            + (
                f"; BatchNorm statistics from {BN_PASSES} seeded batches of 8"
                if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
                else ""
            ),
            "input": {
                "name": spec.input_name,
                "shape": spec.input_shape,
                "layout": spec.layout,
                "feed_shape": _ex(spec.example, 4) if "N" in spec.input_shape else spec.example,
                "dtype": "float32",
            },
            "weighted_nodes": {k: ops[k] for k in WEIGHTED_OPS if ops.get(k)},
            "op_counts": dict(sorted(ops.items())),
            "check": check,
            "export_seconds": round(seconds, 2),
            "bytes": final.stat().st_size,
            "sha256": sha256(final),
            "spec": spec_key(spec, slot, vers),
        }
        return entry
    raise RuntimeError(
        f"{spec.name} {slot}: every exporter failed: "
        + "; ".join(f"{a['exporter']}@{a['opset']}: {a['error']}" for a in attempts)
    )


def describe(spec: Spec) -> dict[str, Any]:
    """The manifest fields that do not change the file: what it is and what to expect of it."""
    outputs = []
    for o in spec.outputs:
        o = dict(o)
        if o["name"] in spec.sqnr_floor:
            o["sqnr_min_db"], o["sqnr_why"] = spec.sqnr_floor[o["name"]]
        outputs.append(o)
    return {
        "architecture": spec.architecture,
        "source": spec.source,
        "fast": spec.fast,
        "outputs": outputs,
        "patterns": spec.patterns,
        "notes": spec.notes,
    }


def load_manifest(path: Path) -> dict[str, Any]:
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("format") == ZOO_FORMAT:
                return data
        except (OSError, ValueError):
            pass
    return {"format": ZOO_FORMAT, "models": []}


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def up_to_date(entry: dict[str, Any] | None, key: dict[str, Any], out: Path) -> bool:
    if not entry or entry.get("spec") != key:
        return False
    f = out / entry["file"]
    return f.is_file() and f.stat().st_size == entry.get("bytes") and sha256(f) == entry.get("sha256")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".zoo", help="output folder (default: .zoo/ at the repo root)")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--fast", action="store_true", help="only the fast subset (what CI tests)")
    ap.add_argument("--force", action="store_true", help="export again even where the manifest entry is current")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    args = ap.parse_args(argv)

    specs = zoo()
    if args.list:
        for s in specs:
            print(f"{s.name:30s} {'fast' if s.fast else '    '} {s.source:12s} {s.architecture}")
        return 0
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {s.name for s in specs})
        if unknown:
            print(f"export_zoo: unknown model(s) {', '.join(unknown)}; see --list", file=sys.stderr)
            return 2
        specs = [s for s in specs if s.name in wanted]
    if args.fast:
        specs = [s for s in specs if s.fast]

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    mpath = out / "manifest.json"
    manifest = load_manifest(mpath)
    manifest["seed"] = SEED
    vers = versions()
    manifest["versions"] = vers
    by_slot = {(m["name"], m["slot"]): m for m in manifest["models"]}
    failed = 0
    t_all = time.perf_counter()
    for spec in specs:
        model = None
        for slot in SLOTS:
            key = spec_key(spec, slot, vers)
            old = by_slot.get((spec.name, slot))
            if not args.force and up_to_date(old, key, out):
                old.update(describe(spec))  # expectations and notes may have changed; the file has not
                print(f"{spec.name:30s} {slot}: up to date ({old['file']})", flush=True)
                continue
            if model is None:
                model = build_model(spec)
            t0 = time.perf_counter()
            try:
                entry = export_slot(spec, slot, out, vers, model)
            except Exception as e:
                failed += 1
                print(f"{spec.name:30s} {slot}: FAILED {_first_line(e)}", flush=True)
                continue
            if old and old["file"] != entry["file"]:
                with contextlib.suppress(FileNotFoundError):
                    (out / old["file"]).unlink()
            by_slot[(spec.name, slot)] = entry
            manifest["models"] = sorted(by_slot.values(), key=lambda m: (m["name"], m["slot"]))
            write_manifest(mpath, manifest)
            note = (
                ""
                if not entry["fallback"]
                else "  (fallback: "
                + "; ".join(f"{a['exporter']}@{a['opset']} failed" for a in entry["fallback"]["failed"])
                + ")"
            )
            print(
                f"{spec.name:30s} {slot}: {entry['file']} {entry['bytes'] / 1e6:.1f} MB, "
                f"{time.perf_counter() - t0:.1f} s{note}",
                flush=True,
            )
    manifest["models"] = sorted(by_slot.values(), key=lambda m: (m["name"], m["slot"]))
    write_manifest(mpath, manifest)
    print(
        f"export_zoo: {len(specs)} models into {out} in {time.perf_counter() - t_all:.0f} s"
        + (f", {failed} slot(s) FAILED" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
