"""Where the tensors of a ``torch.save`` file live, read without running any of its code.

A torch zip holds ``<archive>/data.pkl``; each tensor's storage is a persistent id
``('storage', storage_type, key, location, numel)``. This unpickler records those ids and
never imports anything: every allowed global becomes an inert stand-in, any other global
is refused. No tensor data is read, and nothing touches a GPU.

Why not ``torch.load(path, weights_only=True, mmap=True, map_location=callback)``? It
reports the same location tags on the CUDA-tagged fixture without touching a GPU, and
it refuses code too, but it reports less (checked on tests/fixtures and
tests/test_preflight_cache.py, torch 2.13):

- a pickle that would run ``os.system`` inside a zip without torch's other records is
  refused for the missing ``version`` record, so the report cannot name the unsafe
  global; this reader says ``unsafe pickle: refuses global posix.system``;
- it needs every storage record and, with ``mmap``, the current zip format, so one
  truncated or legacy file yields a paragraph about ``weights_only`` instead of the
  storages it does name;
- it builds every tensor (on mmapped storages), where reading one ``data.pkl`` is enough.

tests/test_preflight_cache.py checks that both readers agree on the location tags.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ALLOWED_MODULES = {
    "torch",
    "torch._utils",
    "torch._tensor",
    "torch.nn.parameter",
    "torch.serialization",
    "torch.storage",
    "collections",
    "builtins",
}
_ALLOWED_BUILTINS = {"set", "frozenset", "tuple", "list", "dict", "slice", "complex"}


class UnsafeContent(pickle.UnpicklingError):
    """The pickle names a global outside the allow-list (arbitrary code on load)."""


@dataclass(frozen=True, slots=True)
class StorageRef:
    key: str
    location: str
    storage_type: str
    numel: int


@dataclass(slots=True)
class FileScan:
    path: Path
    storages: list[StorageRef] = field(default_factory=list)
    error: str | None = None

    @property
    def locations(self) -> set[str]:
        return {s.location for s in self.storages}

    @property
    def non_cpu(self) -> list[StorageRef]:
        return [s for s in self.storages if s.location != "cpu"]


class _Inert:
    """Stand-in for any allowed global: callable, subscriptable, accepts state."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert(self.name)

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _Recorder(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: list[StorageRef] = []
        self._keys: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        allowed = module in _ALLOWED_MODULES and (module != "builtins" or name in _ALLOWED_BUILTINS)
        if not allowed:
            raise UnsafeContent(f"refuses global {module}.{name}")
        return _Inert(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage" and len(pid) >= 5):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        _, storage_type, key, location, numel = pid[:5]
        type_name = storage_type.name if isinstance(storage_type, _Inert) else str(storage_type)
        if str(key) not in self._keys:  # views of one tensor share its storage
            self._keys.add(str(key))
            self.storages.append(StorageRef(str(key), str(location), type_name, int(numel)))
        return _Inert("storage")


def scan_file(path: Path) -> FileScan:
    """Every storage of a torch zip file with its location tag; ``error`` says why not."""
    scan = FileScan(path)
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("data.pkl")]
            if not names:
                scan.error = "no data.pkl inside (not a torch.save zip file)"
                return scan
            data = zf.read(min(names, key=len))
    except zipfile.BadZipFile:
        scan.error = "not a zip file (legacy torch.save format or not a torch file)"
        return scan
    except OSError as exc:
        scan.error = f"cannot read: {exc.strerror or exc}"
        return scan
    recorder = _Recorder(data)
    try:
        recorder.load()
    except UnsafeContent as exc:
        scan.error = f"unsafe pickle: {exc}"
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        scan.error = f"unreadable pickle: {exc}"
    scan.storages = recorder.storages
    return scan
