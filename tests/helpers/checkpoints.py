"""Checkpoint folders in the formats the HF Trainer writes, made with the standard library (no torch)."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path


def safetensors_bytes(values: int = 4) -> bytes:
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * (4 * values)


def torch_zip_bytes(path: Path) -> None:
    """A file shaped like torch.save's (a zip archive); the checker only reads its directory."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")


def write_checkpoint(output_dir: Path, step: int) -> Path:
    """A complete LoRA checkpoint-<step>: trainer state, adapter weights, optimizer."""
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "adapter_model.safetensors").write_bytes(safetensors_bytes())
    torch_zip_bytes(folder / "optimizer.pt")
    return folder
