"""MooncakeWeightStore against a real ``mooncake_master`` on loopback (P2P handshake, no metadata server).

Skipped when the ``mooncake`` package or the ``mooncake_master`` binary is missing (CI does not install
them: ``pip install mooncake-transfer-engine-non-cuda``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rollstream.workers.trainer.weight_store import (
    MooncakeWeightStore,
    WeightStoreError,
    open_weight_store,
)

MASTER = shutil.which("mooncake_master")
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("mooncake") is None, reason="mooncake package not installed (CI)"
    ),
    pytest.mark.skipif(MASTER is None, reason="mooncake_master binary not on PATH (CI)"),
    pytest.mark.timeout(60),
]

SEGMENT = 256 * 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited rc={proc.returncode}:\n{log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"mooncake_master did not listen on 127.0.0.1:{port}:\n{log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A mooncake_master on free loopback ports; yields its ``host:port``, stopped by PID afterwards."""
    assert MASTER is not None
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    rpc_port, metrics_port = _free_port(), _free_port()
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    cmd = [
        MASTER,
        "--rpc_address=127.0.0.1",
        f"--rpc_port={rpc_port}",
        "--metrics_host=127.0.0.1",
        f"--metrics_port={metrics_port}",
        "--enable_http_metadata_server=false",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(rpc_port, proc, log)
        yield f"127.0.0.1:{rpc_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def publisher(master: str) -> Iterator[MooncakeWeightStore]:
    with MooncakeWeightStore(master, global_segment_size=SEGMENT, bucket_mb=4, keep_versions=2) as store:
        yield store


@pytest.fixture(scope="module")
def reader(master: str) -> Iterator[MooncakeWeightStore]:
    # Fetch-only client: contributes no memory, small staging buffer (buckets are read with get_into).
    store = open_weight_store(f"mooncake://{master}?global_segment_size=0&local_buffer_size=4194304")
    assert isinstance(store, MooncakeWeightStore)
    yield store
    store.close()


def _state(seed: int, mb: int = 20) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = mb * 1024 * 1024 // 4 // 10
    state = {f"layer{i}.weight": torch.randn(n, generator=gen) for i in range(10)}
    state["embed.weight"] = torch.randn(n // 4, 4, generator=gen).to(torch.bfloat16)
    state["step"] = torch.tensor([seed], dtype=torch.int64)
    return state


def test_publish_fetch_roundtrip(publisher: MooncakeWeightStore, reader: MooncakeWeightStore) -> None:
    state = _state(1)
    refs = publisher.publish("run-a", 1, state)
    assert len(refs) >= 5  # ~20 MB in 4 MB buckets (2 MB tensors)
    assert sum(r.size for r in refs) > 20 * 1024 * 1024
    got = reader.fetch("run-a", 1, refs)
    assert got.keys() == state.keys()
    for name, t in state.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


def test_corrupted_checksum_raises(publisher: MooncakeWeightStore, reader: MooncakeWeightStore) -> None:
    refs = publisher.publish("run-b", 1, _state(2, mb=4))
    bad = [dataclasses.replace(refs[0], sha256="0" * 64), *refs[1:]]
    with pytest.raises(WeightStoreError, match="sha256"):
        reader.fetch("run-b", 1, bad)
    wrong_size = [dataclasses.replace(refs[0], size=refs[0].size + 1)]
    with pytest.raises(WeightStoreError, match="size"):
        reader.fetch("run-b", 1, wrong_size)


def test_missing_bucket_raises(reader: MooncakeWeightStore) -> None:
    from rollstream.workers.trainer.weight_store import BucketRef

    ref = BucketRef(key="run-x/v00000001/bucket-0000.safetensors", size=10, sha256="0" * 64)
    with pytest.raises(WeightStoreError, match="not found"):
        reader.fetch("run-x", 1, [ref])


def test_old_versions_removed(publisher: MooncakeWeightStore, reader: MooncakeWeightStore) -> None:
    refs = {v: publisher.publish("run-c", v, _state(v, mb=2)) for v in (1, 2, 3)}
    # keep_versions=2: v1 is gone (nobody read it, so no lease blocks the removal), v2 and v3 stay.
    with pytest.raises(WeightStoreError, match="not found"):
        reader.fetch("run-c", 1, refs[1])
    assert torch.equal(reader.fetch("run-c", 2, refs[2])["step"], torch.tensor([2]))
    assert torch.equal(reader.fetch("run-c", 3, refs[3])["step"], torch.tensor([3]))


def test_bucket_larger_than_local_buffer(publisher: MooncakeWeightStore, reader: MooncakeWeightStore) -> None:
    # One 24 MB tensor: its own bucket, 6x the reader's 4 MB staging buffer and over the publisher's 16 MB.
    state = {"big": torch.arange(6 * 1024 * 1024, dtype=torch.float32)}
    refs = publisher.publish("run-d", 1, state)
    assert len(refs) == 1 and refs[0].size > 24 * 1024 * 1024
    assert torch.equal(reader.fetch("run-d", 1, refs)["big"], state["big"])
