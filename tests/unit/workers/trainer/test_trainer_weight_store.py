from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rollstream.workers.policy.model import build_policy, state_dict_checksum
from rollstream.workers.trainer.weight_store import (
    BucketRef,
    DirectoryWeightStore,
    WeightStore,
    WeightStoreError,
    open_weight_store,
)


def test_publish_fetch_roundtrip(tmp_path: Path) -> None:
    model = build_policy(0)
    store = DirectoryWeightStore(tmp_path, bucket_mb=0.05)  # ~50 KiB buckets -> several buckets
    assert isinstance(store, WeightStore)
    refs = store.publish("run-1", 3, model.state_dict())
    assert len(refs) > 3
    assert all(r.key.startswith("run-1/v00000003/") and len(r.sha256) == 64 and r.size > 0 for r in refs)
    assert not list(tmp_path.rglob("*.tmp"))  # temp files were renamed away
    fetched = store.fetch("run-1", 3, refs)
    assert state_dict_checksum(fetched) == state_dict_checksum(model)
    fresh = build_policy(1)
    fresh.load_state_dict(fetched)
    assert state_dict_checksum(fresh) == state_dict_checksum(model)


def test_publish_is_deterministic(tmp_path: Path) -> None:
    store = DirectoryWeightStore(tmp_path, bucket_mb=0.05)
    sd = build_policy(0).state_dict()
    v2 = store.publish("r", 2, sd)
    assert store.publish("r", 1, sd) == [
        BucketRef(r.key.replace("v00000002", "v00000001"), r.size, r.sha256) for r in v2
    ]


def test_checksum_mismatch_names_bucket(tmp_path: Path) -> None:
    store = DirectoryWeightStore(tmp_path, bucket_mb=0.05)
    refs = store.publish("run", 0, {"a": torch.arange(10.0), "b": torch.ones(3, 3)})
    victim = refs[0]
    path = tmp_path / victim.key
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WeightStoreError, match=victim.key):
        store.fetch("run", 0, refs)


def test_missing_bucket_and_wrong_version(tmp_path: Path) -> None:
    store = DirectoryWeightStore(tmp_path, bucket_mb=1)
    refs = store.publish("run", 0, {"a": torch.zeros(4)})
    with pytest.raises(WeightStoreError):
        store.fetch("run", 1, refs)
    (tmp_path / refs[0].key).unlink()
    with pytest.raises(WeightStoreError, match="not found"):
        store.fetch("run", 0, refs)
    with pytest.raises(ValueError):
        store.publish("../evil", 0, {"a": torch.zeros(1)})


def test_open_weight_store(tmp_path: Path) -> None:
    s1 = open_weight_store(str(tmp_path))
    s2 = open_weight_store(f"file://{tmp_path}")
    assert isinstance(s1, DirectoryWeightStore) and isinstance(s2, DirectoryWeightStore)
    assert s2.root == tmp_path
    with pytest.raises(ValueError):
        open_weight_store("s3://bucket/x")


@pytest.mark.skipif(importlib.util.find_spec("mooncake") is not None, reason="mooncake is installed")
def test_mooncake_missing_is_clear() -> None:
    with pytest.raises(WeightStoreError, match="not installed"):
        open_weight_store("mooncake://127.0.0.1:50051?protocol=tcp")
