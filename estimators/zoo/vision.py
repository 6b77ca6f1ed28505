"""CNNs: ResNet (He et al. 2015), VGG-16 (Simonyan & Zisserman 2014), MobileNetV2 (Sandler et al.
2018), MobileNetV3-Small (Howard et al. 2019), and the PyTorch MNIST example's two-conv network."""

from __future__ import annotations

from torch import nn

__all__ = ["resnet", "resnet_stages", "vgg16", "mobilenet_v2", "mobilenet_v3_small", "mnist_cnn"]


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: type[nn.Module] | None = nn.ReLU) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return layers


class _Residual(nn.Module):
    """Basic (2 convs) or bottleneck (1-3-1 convs, 4x expansion) block with projection shortcut."""

    def __init__(self, cin: int, width: int, stride: int, bottleneck: bool):
        super().__init__()
        cout = width * 4 if bottleneck else width
        if bottleneck:
            body = [*_conv_bn(cin, width, 1), *_conv_bn(width, width, 3, stride), *_conv_bn(width, cout, 1, act=None)]
        else:
            body = [*_conv_bn(cin, width, 3, stride), *_conv_bn(width, cout, 3, act=None)]
        self.body = nn.Sequential(*body)
        self.shortcut = (nn.Sequential(*_conv_bn(cin, cout, 1, stride, act=None))
                         if stride != 1 or cin != cout else nn.Identity())
        self.act = nn.ReLU(inplace=True)
        self.out_channels = cout

    def forward(self, x):
        return self.act(self.body(x) + self.shortcut(x))


def resnet_stages(depth: int = 50, small_input: bool = False) -> tuple[list[nn.Module], list[list[_Residual]]]:
    """The stem layers and the four stages of blocks of ResNet-18/34/50/101/152 (also the backbone
    of detection models); ``small_input`` uses the CIFAR stem (3x3 conv, no max-pool)."""
    blocks = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    bottleneck = depth >= 50
    stem = _conv_bn(3, 64, 3) if small_input else [*_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
    stages: list[list[_Residual]] = []
    cin = 64
    for stage, count in enumerate(blocks):
        stages.append([])
        for i in range(count):
            block = _Residual(cin, 64 * 2**stage, 2 if (i == 0 and stage > 0) else 1, bottleneck)
            stages[-1].append(block)
            cin = block.out_channels
    return stem, stages


def resnet(depth: int = 50, num_classes: int = 1000, small_input: bool = False) -> nn.Module:
    """ResNet-18/34/50/101/152 classifier; ``small_input`` uses the CIFAR stem."""
    stem, stages = resnet_stages(depth, small_input)
    width = stages[-1][-1].out_channels
    return nn.Sequential(*stem, *(b for stage in stages for b in stage), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, num_classes))


def vgg16(num_classes: int = 1000) -> nn.Module:
    cfg = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
    layers: list[nn.Module] = []
    cin = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            cin = int(v)
    layers += [nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(inplace=True), nn.Dropout(),
               nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(4096, num_classes)]
    return nn.Sequential(*layers)


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = [] if expand == 1 else _conv_bn(cin, hidden, 1, act=nn.ReLU6)
        layers += [*_conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6), *_conv_bn(hidden, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_v2(num_classes: int = 1000, small_input: bool = False) -> nn.Module:
    settings = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
    layers: list[nn.Module] = _conv_bn(3, 32, 3, 1 if small_input else 2, act=nn.ReLU6)
    cin = 32
    for expand, cout, repeats, stride in settings:
        for i in range(repeats):
            layers.append(_InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
            cin = cout
    layers += [*_conv_bn(cin, 1280, 1, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
               nn.Linear(1280, num_classes)]
    return nn.Sequential(*layers)


def _divisible_by_8(v: float) -> int:
    """Channel rounding of the MobileNet papers: nearest multiple of 8, never more than 10 % down."""
    rounded = max(8, int(v + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * v else rounded


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        squeeze = _divisible_by_8(channels / 4)
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, squeeze, 1), nn.ReLU(inplace=True),
                                  nn.Conv2d(squeeze, channels, 1), nn.Hardsigmoid(inplace=True))

    def forward(self, x):
        return x * self.gate(x)


class _V3Block(nn.Module):
    def __init__(self, cin: int, k: int, hidden: int, cout: int, se: bool, act: type[nn.Module], stride: int):
        super().__init__()
        layers: list[nn.Module] = [] if hidden == cin else _conv_bn_eps(cin, hidden, 1, act=act)
        layers += _conv_bn_eps(hidden, hidden, k, stride, groups=hidden, act=act)
        if se:
            layers.append(_SqueezeExcite(hidden))
        layers += _conv_bn_eps(hidden, cout, 1, act=None)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def _conv_bn_eps(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                 act: type[nn.Module] | None = nn.ReLU) -> list[nn.Module]:
    """MobileNetV3's conv-BN(-activation): BatchNorm eps 1e-3, as the paper's TensorFlow original."""
    layers = _conv_bn(cin, cout, k, stride, groups, act)
    layers[1] = nn.BatchNorm2d(cout, eps=1e-3)
    return layers


def mobilenet_v3_small(num_classes: int = 1000) -> nn.Module:
    """MobileNetV3-Small, Table 2 of the paper: (in, kernel, expanded, out, SE, activation, stride)."""
    relu, hswish = nn.ReLU, nn.Hardswish
    blocks = ((16, 3, 16, 16, True, relu, 2), (16, 3, 72, 24, False, relu, 2), (24, 3, 88, 24, False, relu, 1),
              (24, 5, 96, 40, True, hswish, 2), (40, 5, 240, 40, True, hswish, 1), (40, 5, 240, 40, True, hswish, 1),
              (40, 5, 120, 48, True, hswish, 1), (48, 5, 144, 48, True, hswish, 1), (48, 5, 288, 96, True, hswish, 2),
              (96, 5, 576, 96, True, hswish, 1), (96, 5, 576, 96, True, hswish, 1))
    layers: list[nn.Module] = _conv_bn_eps(3, 16, 3, 2, act=hswish)
    layers += [_V3Block(*b) for b in blocks]
    layers += [*_conv_bn_eps(96, 576, 1, act=hswish), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(576, 1024),
               nn.Hardswish(inplace=True), nn.Dropout(0.2), nn.Linear(1024, num_classes)]
    return nn.Sequential(*layers)


def mnist_cnn() -> nn.Module:
    """The network of PyTorch's MNIST example (two convs, max-pool, two dropouts, two linears)."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10), nn.LogSoftmax(dim=1),
    )
