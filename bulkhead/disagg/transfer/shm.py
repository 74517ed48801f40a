"""Same-host backend: decode's pool lives in a file under /dev/shm that prefill maps.

A write is a copy of each page's bytes in the prefill process (page_copy), so when
write_pages returns or raises nothing is in flight (the drain is trivially
proven). Decode never sees the writes: the write guard cannot run here, and
decode's commit-time generation and digest checks are the guard.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import secrets
import weakref
from dataclasses import asdict, dataclass

import torch

from bulkhead.disagg.transfer.base import TransferError, TransferSource, TransferTarget, torch_dtype
from bulkhead.disagg.transfer.page_copy import copy_pages
from bulkhead.kv import huge_pages
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool, pool_shape

SHM_DIR = "/dev/shm"
_NAME = re.compile(r"bulkhead-kv-(\d+)-[0-9a-f]{16}")


@dataclass(frozen=True)
class ShmDescriptor:
    path: str
    inode: int  # with dev: a stale file, or a new one at a reused path, is not the one we meant
    dev: int
    shape: tuple[int, ...]
    dtype: str
    owner_pid: int  # decode's pid: a dead owner means nobody will read what we write

    def to_dict(self) -> dict:
        return {"backend": "shm", **asdict(self), "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict) -> ShmDescriptor:  # its backend checked by TransferSource.write_pages
        return cls(d["path"], int(d["inode"]), int(d["dev"]), tuple(d["shape"]), d["dtype"], int(d["owner_pid"]))


def _nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _map(fd: int, shape, dtype: torch.dtype) -> tuple[mmap.mmap, torch.Tensor]:
    mm = mmap.mmap(fd, _nbytes(shape, dtype), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    huge_pages.advise(mm)  # the decode pool (bulkhead.kv.huge_pages); shmem takes it only where shmem_enabled allows
    return mm, torch.frombuffer(mm, dtype=dtype).view(shape)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def sweep_stale_files(shm_dir: str = SHM_DIR) -> list[str]:
    """Remove pool files whose creating process is gone (a SIGKILLed or
    SIGTERMed decode never unlinks its file); returns the paths removed.
    Conservative: a file whose pid now belongs to another live process stays."""
    removed = []
    for name in os.listdir(shm_dir):
        m = _NAME.fullmatch(name)
        path = os.path.join(shm_dir, name)
        try:
            if m is None or os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(m.group(1)), 0)
        except FileNotFoundError:
            continue  # removed meanwhile
        except ProcessLookupError:
            _unlink(path)
            removed.append(path)
        except PermissionError:
            pass  # alive
    return removed


class Target(TransferTarget):
    name = "shm"

    def __init__(self, layout: KVLayout, num_pages: int, scrub_mode: str = "zero", shm_dir: str = SHM_DIR):
        super().__init__()
        shape = pool_shape(layout, num_pages)
        dtype = torch_dtype(layout.dtype)
        # pid + random token, created exclusively and private to this uid:
        # never a leftover of a crashed run, never another user's file
        self.path = os.path.join(shm_dir, f"bulkhead-kv-{os.getpid()}-{secrets.token_hex(8)}")  # matches _NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._finalizer = weakref.finalize(self, _unlink, self.path)  # also at interpreter exit
        try:
            os.ftruncate(fd, _nbytes(shape, dtype))
            st = os.fstat(fd)
            self._mmap, data = _map(fd, shape, dtype)
        finally:
            os.close(fd)
        self.pool = KVPool(layout, num_pages, scrub_mode, data=data)
        self._descriptor = ShmDescriptor(self.path, st.st_ino, st.st_dev, shape, layout.dtype, os.getpid())

    def descriptor(self) -> dict:
        return self._descriptor.to_dict()

    def close(self) -> None:
        self._finalizer()  # unlink; the mapping stays valid for self.pool until dropped


class Source(TransferSource):
    name = "shm"

    def __init__(self):
        super().__init__()
        self._maps: dict[str, tuple[ShmDescriptor, mmap.mmap, torch.Tensor]] = {}

    def _check_alive(self, desc: ShmDescriptor) -> None:
        try:
            os.kill(desc.owner_pid, 0)
        except ProcessLookupError:
            self._maps.pop(desc.path, None)
            raise TransferError(f"decode process {desc.owner_pid} owning {desc.path} is gone", drained=True)
        except PermissionError:
            pass  # alive, owned by another user
        try:
            st = os.stat(desc.path)
        except FileNotFoundError:
            self._maps.pop(desc.path, None)
            raise TransferError(f"decode pool {desc.path} was closed (file removed)", drained=True)
        if (st.st_ino, st.st_dev) != (desc.inode, desc.dev):
            self._maps.pop(desc.path, None)
            raise TransferError(f"{desc.path} is not the pool the descriptor names (replaced)", drained=True)

    def _mapping(self, desc: ShmDescriptor) -> torch.Tensor:
        cached = self._maps.get(desc.path)
        if cached is not None and cached[0] == desc:
            return cached[2]
        try:
            fd = os.open(desc.path, os.O_RDWR)  # no O_CREAT: never conjure an empty pool
        except OSError as e:
            raise TransferError(f"cannot open decode pool {desc.path}: {e}", drained=True) from e
        try:
            st = os.fstat(fd)
            dtype = torch_dtype(desc.dtype)
            if (st.st_ino, st.st_dev) != (desc.inode, desc.dev) or st.st_size != _nbytes(desc.shape, dtype):
                raise TransferError(f"{desc.path} is not the pool the descriptor names", drained=True)
            mm, data = _map(fd, desc.shape, dtype)
        finally:
            os.close(fd)
        self._maps[desc.path] = (desc, mm, data)
        return data

    def _write(self, descriptor, request_id, src, src_pages, dst_pages, dst_generations) -> None:
        desc = ShmDescriptor.from_dict(descriptor)
        self._check_alive(desc)
        dst = self._mapping(desc)
        copy_pages(src.data, src_pages, dst, dst_pages)  # all layers, K and V; not through torch (page_copy)
        self._check_alive(desc)  # bytes in a dead decode's memory were not delivered
        nbytes = len(dst_pages) * src.data[0].numel() * src.data.element_size()
        self._stats["bytes_sent"] += nbytes
        self._stats["pages_sent"] += len(dst_pages)

    def close(self) -> None:
        self._maps.clear()  # the mappings unmap once no tensor refers to them

