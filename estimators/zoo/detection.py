"""Mask R-CNN with a ResNet-50-FPN backbone (He et al. 2017; Lin et al. 2017), set up as the
torchvision detection reference trains it (``train.py --model maskrcnn_resnet50_fpn -b 8``, the
thesis' command), for the allocation trace only: layer shapes follow the paper/torchvision
configuration, data-dependent steps (anchor matching, NMS, sampling) are replaced by their
training-time maxima, and the loss has the reference's terms.

Set-up, each from the reference's defaults:
- no ``--weights``/``--weights-backbone``: the backbone trains from scratch, so all five stages are
  trainable and use ordinary BatchNorm (frozen BatchNorm and frozen early stages only apply to
  pre-trained backbones);
- SGD with momentum (``--opt sgd``), no AMP;
- images resized to a shorter side of 800 px, longer side <= 1333, batched on a canvas of the
  batch's largest height x largest width, padded to a multiple of 32. Batches of one aspect-ratio
  group give at most 800 x 1344, but the reference's grouped batch sampler ends every epoch with
  batches of left-over images from mixed groups (portrait and landscape together): up to
  1344 x 1344. nvidia-smi's peak over the epoch sees the largest canvas, so that is the input.
- RPN: 3 anchors per location on P2-P6, 2000 proposals per image after NMS, 256 sampled anchors per
  image for its loss; box head: 512 sampled RoIs per image (7 x 7 RoIAlign, two 1024-wide FCs);
  mask head: up to 25 % of them positive (14 x 14 RoIAlign, four 3x3 convs, 2x deconv, 28 x 28 masks).

RoIAlign is not in core torch (torchvision does not import here); ``_RoIAlignFootprint`` allocates
what it allocates: the pooled output, and on backward a zero gradient of the whole feature map.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from estimators.zoo import vision

__all__ = ["maskrcnn_resnet50_fpn", "MASKRCNN_CANVAS"]

MASKRCNN_CANVAS = (3, 1344, 1344)
_FPN_WIDTH = 256
_ANCHORS_PER_LOCATION = 3
_PROPOSALS_PER_IMAGE = 2000
_RPN_SAMPLES_PER_IMAGE = 256
_ROIS_PER_IMAGE = 512
_POSITIVE_FRACTION = 0.25


class _RoIAlignFootprint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
        ctx.feature_shape = features.shape
        ctx.save_for_backward(boxes)
        return features.new_empty((boxes.shape[0], features.shape[1], size, size))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.new_zeros(ctx.feature_shape), None, None


def _multiscale_roi_align(levels: list[torch.Tensor], boxes: torch.Tensor, size: int) -> torch.Tensor:
    """RoIs spread over P2-P5 (torchvision assigns them by box size; every level gets some)."""
    chunks = boxes.chunk(len(levels))
    return torch.cat([_RoIAlignFootprint.apply(f, b, size) for f, b in zip(levels, chunks)])


class _MaskRCNN(nn.Module):
    def __init__(self, num_classes: int = 91):
        super().__init__()
        stem, stages = vision.resnet_stages(50)
        self.stem = nn.Sequential(*stem)
        self.stages = nn.ModuleList(nn.Sequential(*stage) for stage in stages)
        widths = [stage[-1].out_channels for stage in stages]
        self.lateral = nn.ModuleList(nn.Conv2d(w, _FPN_WIDTH, 1) for w in widths)
        self.smooth = nn.ModuleList(nn.Conv2d(_FPN_WIDTH, _FPN_WIDTH, 3, padding=1) for _ in widths)
        self.rpn_conv = nn.Conv2d(_FPN_WIDTH, _FPN_WIDTH, 3, padding=1)
        self.rpn_objectness = nn.Conv2d(_FPN_WIDTH, _ANCHORS_PER_LOCATION, 1)
        self.rpn_deltas = nn.Conv2d(_FPN_WIDTH, 4 * _ANCHORS_PER_LOCATION, 1)
        self.box_head = nn.Sequential(nn.Flatten(), nn.Linear(_FPN_WIDTH * 49, 1024), nn.ReLU(inplace=True),
                                      nn.Linear(1024, 1024), nn.ReLU(inplace=True))
        self.box_classes = nn.Linear(1024, num_classes)
        self.box_deltas = nn.Linear(1024, 4 * num_classes)
        mask_layers: list[nn.Module] = []
        for _ in range(4):
            mask_layers += [nn.Conv2d(_FPN_WIDTH, _FPN_WIDTH, 3, padding=1), nn.ReLU(inplace=True)]
        self.mask_head = nn.Sequential(*mask_layers, nn.ConvTranspose2d(_FPN_WIDTH, _FPN_WIDTH, 2, 2),
                                       nn.ReLU(inplace=True), nn.Conv2d(_FPN_WIDTH, num_classes, 1))
        self.num_classes = num_classes

    def _pyramid(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(images)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        inner = self.lateral[-1](features[-1])
        levels = [self.smooth[-1](inner)]
        for i in range(len(features) - 2, -1, -1):
            lateral = self.lateral[i](features[i])
            inner = lateral + F.interpolate(inner, size=lateral.shape[-2:], mode="nearest")
            levels.insert(0, self.smooth[i](inner))
        return levels + [F.max_pool2d(levels[-1], 1, 2)]  # P2..P5 and P6

    def _rpn(self, levels: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        b = levels[0].shape[0]
        objectness, deltas = [], []
        for p in levels:
            t = F.relu(self.rpn_conv(p))
            objectness.append(self.rpn_objectness(t).permute(0, 2, 3, 1).reshape(b, -1))
            deltas.append(self.rpn_deltas(t).permute(0, 2, 3, 1).reshape(b, -1, 4))
        objectness, deltas = torch.cat(objectness, 1), torch.cat(deltas, 1)
        sampled = torch.randint(0, objectness.shape[1], (b, _RPN_SAMPLES_PER_IMAGE), device=objectness.device)
        labels = torch.randint(0, 2, sampled.shape, device=objectness.device).float()
        loss = F.binary_cross_entropy_with_logits(objectness.gather(1, sampled), labels) + F.smooth_l1_loss(
            deltas.gather(1, sampled[..., None].expand(-1, -1, 4)), torch.zeros(b, _RPN_SAMPLES_PER_IMAGE, 4,
                                                                               device=deltas.device))
        # Proposals: the top-scoring anchors' boxes, detached (NMS keeps at most 2000 per image).
        top = objectness.detach().topk(min(_PROPOSALS_PER_IMAGE, objectness.shape[1]), dim=1).indices
        proposals = deltas.detach().gather(1, top[..., None].expand(-1, -1, 4))
        return loss, proposals

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        images = (images - 0.45) / 0.225  # the transform normalises every image before batching
        levels = self._pyramid(images)
        rpn_loss, proposals = self._rpn(levels)
        rois = proposals[:, :_ROIS_PER_IMAGE].reshape(-1, 4)
        n = rois.shape[0]
        hidden = self.box_head(_multiscale_roi_align(levels[:4], rois, 7))
        labels = torch.randint(0, self.num_classes, (n,), device=rois.device)
        picked = self.box_deltas(hidden).reshape(n, -1, 4)[torch.arange(n, device=rois.device), labels]
        box_loss = F.cross_entropy(self.box_classes(hidden), labels) + F.smooth_l1_loss(picked, torch.zeros_like(picked))
        positives = int(n * _POSITIVE_FRACTION)
        masks = self.mask_head(_multiscale_roi_align(levels[:4], rois[:positives], 14))
        mask_logits = masks[torch.arange(positives, device=rois.device), labels[:positives]]
        mask_loss = F.binary_cross_entropy_with_logits(mask_logits, torch.rand_like(mask_logits))
        return rpn_loss + box_loss + mask_loss


def maskrcnn_resnet50_fpn(num_classes: int = 91) -> nn.Module:
    return _MaskRCNN(num_classes)
