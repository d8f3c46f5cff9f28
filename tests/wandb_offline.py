"""Read what an offline W&B run recorded, straight from its ``.wandb`` file.

Format: a 7-byte header (``:W&B``, 0xBEE1, version), then LevelDB-log
records in 32 KiB blocks, each ``<IHB>`` (crc32, length, type) + payload; payloads are
``wandb_internal_pb2.Record`` protobufs.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb  # type: ignore[attr-defined]  # generated protobuf module

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a .wandb file")
    out, pos, pending = [], _HEADER, b""
    while pos + 7 <= len(data):
        block_left = _BLOCK - (pos % _BLOCK)
        if block_left < 7:
            pos += block_left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += block_left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            out.append(pending + chunk)
            pending = b""
    return out


@dataclass
class OfflineRun:
    run_id: str | None = None
    exit_code: int | None = None
    history: list[dict[str, object]] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)


def read_offline_run(wandb_file: Path) -> OfflineRun:
    run = OfflineRun()
    for payload in _payloads(wandb_file.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
        elif kind == "history":
            run.history.append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
            )
        elif kind == "summary":
            for item in record.summary.update:
                run.summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def find_wandb_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
