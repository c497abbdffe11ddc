"""Versioned policy weights in checksummed safetensors buckets (ARCHITECTURE.md section 6).

The trainer ``publish``es a version and puts the returned ``BucketRef`` list on the weight-versions topic;
generation workers ``fetch`` with those refs. Weights never travel through Kafka.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
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


def _address(buf: bytes | bytearray) -> int:
    """Address of a buffer's bytes, without a copy (for ``bytes`` read-only: Mooncake only reads it)."""
    if isinstance(buf, bytes):
        return ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value or 0
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


class MooncakeWeightStore(_BucketedStore):
    """Buckets as objects in a Mooncake distributed store (``mooncake.store.MooncakeDistributedStore``).

    Needs a running ``mooncake_master``. With ``metadata_server="P2PHANDSHAKE"`` (the default) the
    transfer engines exchange segment descriptors directly and no metadata server is needed; otherwise
    give the HTTP metadata server's URL (``mooncake_master --enable_http_metadata_server=true`` or
    ``python -m mooncake.http_metadata_server``).

    Objects live in the memory that clients contribute (``global_segment_size``), so the publisher must
    contribute enough for ``keep_versions`` versions of the model and stay up while workers fetch: a bucket
    in a segment disappears when its client closes. Buckets are hard-pinned (never evicted) and put
    preferably in the publisher's own segment; after each ``publish`` the versions older than the newest
    ``keep_versions`` this instance published are removed (a removal refused because a reader holds the
    lease is retried on the next publish). Fetch-only clients should pass ``global_segment_size=0``.

    Data moves with ``upsert_from``/``get_into`` straight from and into the bucket buffers, so a bucket may
    be larger than ``local_buffer_size`` (the plain ``put``/``get`` stage the whole value through it).
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
        local_buffer_size: int = 16 * 1024 * 1024,
        bucket_mb: float = 64.0,
        key_prefix: str = "rollstream/weights/",
        keep_versions: int = 2,
    ) -> None:
        super().__init__(bucket_mb)
        if keep_versions < 1:
            raise ValueError(f"keep_versions={keep_versions!r}: must be >= 1")
        if global_segment_size < 0 or local_buffer_size <= 0:
            raise ValueError(
                f"global_segment_size={global_segment_size!r} must be >= 0 and "
                f"local_buffer_size={local_buffer_size!r} > 0"
            )
        # The transfer engine advertises this address to peers (it reads it at setup); keep it on loopback
        # unless the operator chose otherwise. Its listeners still bind all interfaces (Mooncake 0.3.13).
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        except ImportError as e:
            raise WeightStoreError(
                "Mooncake weight store requested but the 'mooncake' package is not installed; "
                "install mooncake-transfer-engine (pip install 'rollstream[mooncake]') or use a directory "
                "store (a path or file:// URI)"
            ) from e
        self.master_server_address = master_server_address
        self.metadata_server = metadata_server or "P2PHANDSHAKE"
        self.key_prefix = key_prefix
        self.keep_versions = keep_versions
        self._published: dict[str, list[int]] = {}  # run_id -> versions this instance published, ascending
        self._stale: dict[str, list[str]] = {}  # run_id -> bucket keys whose removal is still due
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
            raise WeightStoreError(
                f"mooncake setup failed (rc={rc}) master={master_server_address} "
                f"metadata_server={self.metadata_server}: is mooncake_master running there?"
            )
        self._closed = False
        self._config: Any = ReplicateConfig()
        self._config.replica_num = 1
        self._config.with_hard_pin = True  # weights must not be evicted under memory pressure
        if global_segment_size > 0:
            self._config.preferred_segment = self._store.get_hostname()

    def __enter__(self) -> MooncakeWeightStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, key: str, data: bytes) -> None:
        ptr = _address(data)
        # Registration makes the buffer reachable for RDMA; on TCP it is cheap bookkeeping.
        reg = self._store.register_buffer(ptr, len(data))
        try:
            rc = self._store.upsert_from(self.key_prefix + key, ptr, len(data), self._config)
        finally:
            if reg == 0:
                self._store.unregister_buffer(ptr)
        if rc != 0:
            hint = " (no room: the segments are full, raise global_segment_size)" if rc == -200 else ""
            raise WeightStoreError(f"mooncake put of bucket {key!r} ({len(data)} B) failed (rc={rc}){hint}")

    def _get(self, key: str) -> bytes:
        full = self.key_prefix + key
        size = self._store.get_size(full)
        if size < 0:
            raise WeightStoreError(f"bucket {key!r} not found in mooncake store (rc={size})")
        buf = bytearray(size)
        if size == 0:
            return b""
        ptr = _address(buf)
        reg = self._store.register_buffer(ptr, size)
        try:
            n = self._store.get_into(full, ptr, size)
        finally:
            if reg == 0:
                self._store.unregister_buffer(ptr)
        if n != size:
            raise WeightStoreError(f"mooncake get of bucket {key!r} failed (rc={n}, expected {size} B)")
        return bytes(buf)  # safetensors.torch.load takes bytes only

    def publish(self, run_id: str, version: int, state_dict: Mapping[str, torch.Tensor]) -> list[BucketRef]:
        refs = super().publish(run_id, version, state_dict)
        versions = self._published.setdefault(run_id, [])
        if version not in versions:
            versions.append(version)
            versions.sort()
        stale = self._stale.setdefault(run_id, [])
        while len(versions) > self.keep_versions:
            old = versions.pop(0)
            stale.append(f"{self.key_prefix}{run_id}/v{old:08d}/")
        self._remove_stale(run_id)
        return refs

    def _remove_stale(self, run_id: str) -> None:
        """Remove the buckets of versions past retention; a prefix stays due while any removal fails."""
        still: list[str] = []
        for prefix in self._stale.get(run_id, []):
            rc = self._store.remove_by_regex("^" + re.escape(prefix))
            if rc < 0:
                still.append(prefix)
        self._stale[run_id] = still

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._store.close()


def open_weight_store(uri: str | Path, *, bucket_mb: float = 64.0) -> WeightStore:
    """``/path`` or ``file:///path`` -> DirectoryWeightStore;
    ``mooncake://master:50051?metadata_server=P2PHANDSHAKE&protocol=tcp&local_hostname=...`` (also
    ``device_name``, ``global_segment_size`` and ``local_buffer_size`` in bytes, ``keep_versions``,
    ``bucket_mb``; ``metadata_server`` defaults to P2PHANDSHAKE, else ``http://h:8080/metadata``)
    -> MooncakeWeightStore."""
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
            "keep_versions",
        }
        unknown = set(q) - known
        if unknown:
            raise ValueError(f"unknown mooncake URI parameters {sorted(unknown)}")
        kwargs: dict[str, Any] = {
            k: q[k] for k in ("metadata_server", "local_hostname", "protocol", "device_name") if k in q
        }
        for k in ("global_segment_size", "local_buffer_size", "keep_versions"):
            if k in q:
                kwargs[k] = int(q[k])
        return MooncakeWeightStore(parsed.netloc, bucket_mb=float(q.get("bucket_mb", bucket_mb)), **kwargs)
    raise ValueError(f"unsupported weight store URI scheme {parsed.scheme!r} in {uri!r}")
