"""Versioned policy weights in checksummed safetensors buckets (ARCHITECTURE.md section 6).

The trainer ``publish``es a version and puts the returned ``BucketRef`` list on the weight-versions topic;
generation workers ``fetch`` with those refs. Weights never travel through Kafka.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qs, unquote, urlparse

import safetensors.torch
import torch


class WeightStoreError(RuntimeError):
    pass


@dataclass(frozen=True)
class BucketRef:
    key: str  # store-relative key, e.g. "run-1/v00000003/bucket-0000.safetensors"
    size: int  # bytes
    sha256: str


@runtime_checkable
class WeightStore(Protocol):
    def publish(
        self, run_id: str, version: int, state_dict: Mapping[str, torch.Tensor]
    ) -> list[BucketRef]: ...

    def fetch(self, run_id: str, version: int, buckets: list[BucketRef]) -> dict[str, torch.Tensor]: ...


def _check_id(run_id: str, version: int) -> None:
    if not run_id or "/" in run_id or "\\" in run_id or run_id in (".", ".."):
        raise ValueError(f"run_id={run_id!r}: must be a non-empty name without path separators")
    if version < 0:
        raise ValueError(f"version={version!r}: must be >= 0")


def _bucket_key(run_id: str, version: int, index: int) -> str:
    return f"{run_id}/v{version:08d}/bucket-{index:04d}.safetensors"


def split_buckets(state_dict: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Greedy split in sorted-name order (deterministic); a tensor larger than a bucket gets its own."""
    buckets: list[dict[str, torch.Tensor]] = []
    cur: dict[str, torch.Tensor] = {}
    cur_bytes = 0
    for name in sorted(state_dict):
        # Own copy per tensor: safetensors refuses shared storage (tied embeddings) and non-contiguous views.
        t = state_dict[name].detach().to("cpu", copy=True).contiguous()
        nbytes = t.numel() * t.element_size()
        if cur and cur_bytes + nbytes > bucket_bytes:
            buckets.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = t
        cur_bytes += nbytes
    if cur:
        buckets.append(cur)
    return buckets


class _BucketedStore:
    """Shared publish/fetch logic; subclasses move opaque bytes by key."""

    def __init__(self, bucket_mb: float) -> None:
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb={bucket_mb!r}: must be > 0")
        self.bucket_bytes = max(1, int(bucket_mb * 1024 * 1024))

    def _put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _get(self, key: str) -> bytes:
        raise NotImplementedError

    def publish(self, run_id: str, version: int, state_dict: Mapping[str, torch.Tensor]) -> list[BucketRef]:
        _check_id(run_id, version)
        refs: list[BucketRef] = []
        for i, bucket in enumerate(split_buckets(state_dict, self.bucket_bytes)):
            data = safetensors.torch.save(bucket)
            key = _bucket_key(run_id, version, i)
            self._put(key, data)
            refs.append(BucketRef(key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
        return refs

    def fetch(self, run_id: str, version: int, buckets: list[BucketRef]) -> dict[str, torch.Tensor]:
        _check_id(run_id, version)
        prefix = f"{run_id}/v{version:08d}/"
        out: dict[str, torch.Tensor] = {}
        for ref in buckets:
            if not ref.key.startswith(prefix):
                raise WeightStoreError(f"bucket {ref.key!r} does not belong to {run_id} v{version}")
            data = self._get(ref.key)
            if len(data) != ref.size:
                raise WeightStoreError(f"bucket {ref.key!r}: size {len(data)} != expected {ref.size}")
            digest = hashlib.sha256(data).hexdigest()
            if digest != ref.sha256:
                raise WeightStoreError(f"bucket {ref.key!r}: sha256 {digest} != expected {ref.sha256}")
            tensors = safetensors.torch.load(data)
            dup = out.keys() & tensors.keys()
            if dup:
                raise WeightStoreError(f"bucket {ref.key!r} repeats tensors {sorted(dup)[:3]}")
            out.update(tensors)
        return out


class DirectoryWeightStore(_BucketedStore):
    """Buckets as files under ``root``; each is written to a temp file, fsynced, then renamed (atomic)."""

    def __init__(self, root: Path | str, bucket_mb: float = 64.0) -> None:
        super().__init__(bucket_mb)
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise WeightStoreError(f"bucket key {key!r} escapes the store root")
        return path

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # readers see the old file or the complete new one, never a torn write
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise WeightStoreError(f"bucket {key!r} not found under {self.root}") from e


class MooncakeWeightStore(_BucketedStore):
    """Buckets as objects in a Mooncake distributed store (``mooncake.store.MooncakeDistributedStore``).

    Needs a running ``mooncake_master`` (and its HTTP metadata server unless ``P2PHANDSHAKE``).
    """

    def __init__(
        self,
        master_server_address: str,
        *,
        metadata_server: str | None = None,
        local_hostname: str = "127.0.0.1",
        protocol: str = "tcp",
        device_name: str = "",
        global_segment_size: int = 512 * 1024 * 1024,
        local_buffer_size: int = 128 * 1024 * 1024,
        bucket_mb: float = 64.0,
        key_prefix: str = "rollstream/weights/",
    ) -> None:
        super().__init__(bucket_mb)
        # Keep the transfer engine's TCP listener on loopback unless the operator chose otherwise; it reads
        # this at import/setup time, so it must be set before the import below.
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise WeightStoreError(
                "Mooncake weight store requested but the 'mooncake' package is not installed; "
                "install mooncake-transfer-engine (pip install 'rollstream[mooncake]') or use a directory "
                "store (a path or file:// URI)"
            ) from e
        host = master_server_address.rsplit(":", 1)[0]
        self.metadata_server = metadata_server or f"http://{host}:8080/metadata"
        self.key_prefix = key_prefix
        self._store: Any = MooncakeDistributedStore()
        rc = self._store.setup(
            local_hostname,
            self.metadata_server,
            global_segment_size,
            local_buffer_size,
            protocol,
            device_name,
            master_server_address,
        )
        if rc != 0:
            raise WeightStoreError(f"mooncake setup failed (rc={rc}) master={master_server_address}")

    def _put(self, key: str, data: bytes) -> None:
        rc = self._store.put(self.key_prefix + key, data)
        if rc != 0:
            raise WeightStoreError(f"mooncake put of bucket {key!r} failed (rc={rc})")

    def _get(self, key: str) -> bytes:
        data = self._store.get(self.key_prefix + key)
        if not data:  # the binding returns empty bytes for a missing key
            raise WeightStoreError(f"bucket {key!r} not found in mooncake store")
        return bytes(data)

    def close(self) -> None:
        self._store.close()


def open_weight_store(uri: str | Path, *, bucket_mb: float = 64.0) -> WeightStore:
    """``/path`` or ``file:///path`` -> DirectoryWeightStore;
    ``mooncake://master:50051?metadata_server=http://h:8080/metadata&protocol=tcp&local_hostname=...``
    -> MooncakeWeightStore (``bucket_mb`` may also be given as a query parameter)."""
    if isinstance(uri, Path):
        return DirectoryWeightStore(uri, bucket_mb)
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file URI with a remote host is not supported: {uri!r}")
        return DirectoryWeightStore(Path(path), bucket_mb)
    if parsed.scheme == "mooncake":
        if not parsed.netloc:
            raise ValueError(f"mooncake URI needs a master address: {uri!r}")
        q = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        known = {
            "metadata_server",
            "local_hostname",
            "protocol",
            "device_name",
            "global_segment_size",
            "local_buffer_size",
            "bucket_mb",
        }
        unknown = set(q) - known
        if unknown:
            raise ValueError(f"unknown mooncake URI parameters {sorted(unknown)}")
        kwargs: dict[str, Any] = {
            k: q[k] for k in ("metadata_server", "local_hostname", "protocol", "device_name") if k in q
        }
        for k in ("global_segment_size", "local_buffer_size"):
            if k in q:
                kwargs[k] = int(q[k])
        return MooncakeWeightStore(parsed.netloc, bucket_mb=float(q.get("bucket_mb", bucket_mb)), **kwargs)
    raise ValueError(f"unsupported weight store URI scheme {parsed.scheme!r} in {uri!r}")
