"""More CNNs of the thesis workloads: Xception (Chollet 2017), Inception v3 (Szegedy et al. 2015,
with the auxiliary classifier it trains with), EfficientNet-B0 (Tan & Le 2019)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["xception", "inception_v3", "efficientnet_b0"]


def _bn_act(cin: int, cout: int, k: int | tuple[int, int], stride: int = 1, padding: int | tuple[int, int] = 0,
            groups: int = 1, act: type[nn.Module] = nn.ReLU, eps: float = 1e-5) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding, groups=groups, bias=False),
                         nn.BatchNorm2d(cout, eps=eps), act(inplace=True))


# --- Xception -----------------------------------------------------------------------------------

class _SeparableConv(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cin, 3, 1, 1, groups=cin, bias=False), nn.Conv2d(cin, cout, 1, bias=False))


class _XceptionBlock(nn.Module):
    def __init__(self, cin: int, cout: int, reps: int, stride: int, relu_first: bool = True, grow_first: bool = True):
        super().__init__()
        layers: list[nn.Module] = []
        width = cin
        for i in range(reps):
            target = cout if (grow_first and i == 0) or (not grow_first and i == reps - 1) else width
            if i > 0 or relu_first:
                # The block's input also feeds the skip path, so only its first ReLU must not be in-place.
                layers.append(nn.ReLU(inplace=i > 0))
            layers += [_SeparableConv(width, target), nn.BatchNorm2d(target)]
            width = target
        if stride != 1:
            layers.append(nn.MaxPool2d(3, stride, 1))
        self.body = nn.Sequential(*layers)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if cin != cout or stride != 1 else nn.Identity())

    def forward(self, x):
        return self.body(x) + self.skip(x)


def xception(num_classes: int = 1000) -> nn.Module:
    return nn.Sequential(
        _bn_act(3, 32, 3, 2), _bn_act(32, 64, 3),
        _XceptionBlock(64, 128, 2, 2, relu_first=False), _XceptionBlock(128, 256, 2, 2), _XceptionBlock(256, 728, 2, 2),
        *(_XceptionBlock(728, 728, 3, 1) for _ in range(8)),
        _XceptionBlock(728, 1024, 2, 2, grow_first=False),
        _SeparableConv(1024, 1536), nn.BatchNorm2d(1536), nn.ReLU(inplace=True),
        _SeparableConv(1536, 2048), nn.BatchNorm2d(2048), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes),
    )


# --- Inception v3 ---------------------------------------------------------------------------------

def _c(cin: int, cout: int, k: int | tuple[int, int], stride: int = 1, padding: int | tuple[int, int] = 0) -> nn.Sequential:
    return _bn_act(cin, cout, k, stride, padding, eps=1e-3)


class _Branches(nn.Module):
    """Parallel branches concatenated along channels (every Inception module)."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], 1)


class _Split(nn.Module):
    """A stem followed by a 1x3 and a 3x1 conv whose outputs are concatenated (Inception E)."""

    def __init__(self, stem: nn.Module, width: int, out: int):
        super().__init__()
        self.stem, self.a, self.b = stem, _c(width, out, (1, 3), padding=(0, 1)), _c(width, out, (3, 1), padding=(1, 0))

    def forward(self, x):
        y = self.stem(x)
        return torch.cat([self.a(y), self.b(y)], 1)


def _pool_proj(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, 1, 1), _c(cin, cout, 1))


def _inception_a(cin: int, pool: int) -> nn.Module:
    return _Branches(_c(cin, 64, 1), nn.Sequential(_c(cin, 48, 1), _c(48, 64, 5, padding=2)),
                     nn.Sequential(_c(cin, 64, 1), _c(64, 96, 3, padding=1), _c(96, 96, 3, padding=1)),
                     _pool_proj(cin, pool))


def _inception_c(c7: int) -> nn.Module:
    s, t = (0, 3), (3, 0)
    return _Branches(_c(768, 192, 1),
                     nn.Sequential(_c(768, c7, 1), _c(c7, c7, (1, 7), padding=s), _c(c7, 192, (7, 1), padding=t)),
                     nn.Sequential(_c(768, c7, 1), _c(c7, c7, (7, 1), padding=t), _c(c7, c7, (1, 7), padding=s),
                                   _c(c7, c7, (7, 1), padding=t), _c(c7, 192, (1, 7), padding=s)),
                     _pool_proj(768, 192))


def _inception_e(cin: int) -> nn.Module:
    return _Branches(_c(cin, 320, 1), _Split(_c(cin, 384, 1), 384, 384),
                     _Split(nn.Sequential(_c(cin, 448, 1), _c(448, 384, 3, padding=1)), 384, 384), _pool_proj(cin, 192))


class _InceptionV3(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.stem = nn.Sequential(_c(3, 32, 3, 2), _c(32, 32, 3), _c(32, 64, 3, padding=1), nn.MaxPool2d(3, 2),
                                  _c(64, 80, 1), _c(80, 192, 3), nn.MaxPool2d(3, 2))
        self.mid = nn.Sequential(
            _inception_a(192, 32), _inception_a(256, 64), _inception_a(288, 64),
            _Branches(_c(288, 384, 3, 2), nn.Sequential(_c(288, 64, 1), _c(64, 96, 3, padding=1), _c(96, 96, 3, 2)),
                      nn.MaxPool2d(3, 2)),
            _inception_c(128), _inception_c(160), _inception_c(160), _inception_c(192))
        self.aux = nn.Sequential(nn.AvgPool2d(5, 3), _c(768, 128, 1), _c(128, 768, 5), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(768, num_classes))
        self.top = nn.Sequential(
            _Branches(nn.Sequential(_c(768, 192, 1), _c(192, 320, 3, 2)),
                      nn.Sequential(_c(768, 192, 1), _c(192, 192, (1, 7), padding=(0, 3)),
                                    _c(192, 192, (7, 1), padding=(3, 0)), _c(192, 192, 3, 2)),
                      nn.MaxPool2d(3, 2)),
            _inception_e(1280), _inception_e(2048), nn.AdaptiveAvgPool2d(1), nn.Dropout(0.5), nn.Flatten(),
            nn.Linear(2048, num_classes))

    def forward(self, x):
        mid = self.mid(self.stem(x))
        logits = self.top(mid)
        # Training adds 0.4 x the auxiliary classifier's loss; summing logits keeps its graph alive.
        return logits + 0.4 * self.aux(mid) if self.training else logits


def inception_v3(num_classes: int = 1000) -> nn.Module:
    return _InceptionV3(num_classes)


# --- EfficientNet-B0 --------------------------------------------------------------------------------

class _MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, k: int, stride: int):
        super().__init__()
        hidden = cin * expand
        squeeze = max(1, cin // 4)
        self.expand = _bn_act(cin, hidden, 1, act=nn.SiLU) if expand != 1 else nn.Identity()
        self.depthwise = _bn_act(hidden, hidden, k, stride, k // 2, groups=hidden, act=nn.SiLU)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden, squeeze, 1), nn.SiLU(),
                                nn.Conv2d(squeeze, hidden, 1), nn.Sigmoid())
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.depthwise(self.expand(x))
        y = self.project(y * self.se(y))
        return x + y if self.residual else y


def efficientnet_b0(num_classes: int = 1000) -> nn.Module:
    stages = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
              (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
    layers: list[nn.Module] = [_bn_act(3, 32, 3, 2, 1, act=nn.SiLU)]
    cin = 32
    for expand, k, stride, cout, repeats in stages:
        for i in range(repeats):
            layers.append(_MBConv(cin, cout, expand, k, stride if i == 0 else 1))
            cin = cout
    layers += [_bn_act(cin, 1280, 1, act=nn.SiLU), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
               nn.Linear(1280, num_classes)]
    return nn.Sequential(*layers)
