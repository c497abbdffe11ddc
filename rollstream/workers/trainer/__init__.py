"""Trainer side: GRPO step, staleness-aware sample buffer, bucketed weight store."""

from rollstream.workers.trainer.buffer import SampleBuffer
from rollstream.workers.trainer.grpo import (
    GrpoConfig,
    Sample,
    group_advantages,
    make_optimizer,
    train_step,
)
from rollstream.workers.trainer.weight_store import (
    BucketRef,
    DirectoryWeightStore,
    MooncakeWeightStore,
    WeightStore,
    WeightStoreError,
    open_weight_store,
)

__all__ = [
    "BucketRef",
    "DirectoryWeightStore",
    "GrpoConfig",
    "MooncakeWeightStore",
    "Sample",
    "SampleBuffer",
    "WeightStore",
    "WeightStoreError",
    "group_advantages",
    "make_optimizer",
    "open_weight_store",
    "train_step",
]
