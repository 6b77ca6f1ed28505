"""Torch-only definitions of the thesis workloads' architectures (torchvision/timm/transformers do
not import beside torch 2.13 here). Written from the architectures' papers; layer shapes and
parameter counts match the published models (checked in tests), weights are never loaded."""

from estimators.zoo.registry import ZOO, build

__all__ = ["ZOO", "build"]
