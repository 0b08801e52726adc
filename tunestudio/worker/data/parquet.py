"""Reading Parquet files as rows, a record batch at a time, refusing decompression bombs before they are decoded
(issue 30): the worker's reader (`sources.iter_file`) and the preview's (`sources.read_file_head`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunestudio.worker.data.rows import Row
from tunestudio.worker.errors import UserError

# Parquet decompression bombs: what is bounded is what a file decodes to, not its size (2 KB of zstd held 1 GB
# of rows). Before anything is decoded, a column chunk whose pages decompress to more than
# PARQUET_MAX_EXPANSION times their stored bytes (once past PARQUET_JUDGED_FROM) is refused, as its metadata
# says. Strings are then read with their dictionaries kept (a dictionary page can repeat one long string in every
# row, which no size in the metadata shows), and the rows are refused before they are decoded past
# PARQUET_MAX_EXPANSION times the file's size, or PARQUET_FREE_BYTES for a small file.
PARQUET_MAX_EXPANSION = 100
PARQUET_JUDGED_FROM = 1 << 20
PARQUET_FREE_BYTES = 256 << 20
_AS_JSONL = "if the rows are real, save them as JSON Lines"


def _parquet_file(path: Path) -> tuple[Any, Any]:
    """(the pyarrow ParquetFile, reading strings as dictionaries, and the schema that decodes them), once the
    metadata shows no column chunk that decompresses like a bomb."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None
    meta = parquet.metadata
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        for column in range(info.num_columns):
            chunk = info.column(column)
            raw, stored = chunk.total_uncompressed_size, max(chunk.total_compressed_size, 1)
            if raw > PARQUET_JUDGED_FROM and raw > PARQUET_MAX_EXPANSION * stored:
                raise UserError(
                    f"dataset {path}: row group {group}, column {chunk.path_in_schema!r} stores {stored:,} bytes that "
                    f"decompress to {raw:,} ({raw // stored:,} times as many): refused as a decompression bomb "
                    f"(Parquet data may expand at most {PARQUET_MAX_EXPANSION:,} times; {_AS_JSONL})")
    strings = [c.path for c in parquet.schema if c.physical_type == "BYTE_ARRAY" and c.logical_type.type != "DECIMAL"]
    try:
        return pq.ParquetFile(path, read_dictionary=strings), parquet.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None


def _decoded_bytes(array: Any) -> int:
    """The bytes an Arrow array (or record batch) takes once its dictionaries are decoded, counted without
    decoding them (Python's rows take at least as much)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.RecordBatch):
        return sum(_decoded_bytes(column) for column in array.columns)
    if isinstance(array, pa.DictionaryArray):
        return int(pc.sum(pc.take(pc.binary_length(array.dictionary), array.indices)).as_py() or 0)
    if isinstance(array, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        return 8 * len(array) + _decoded_bytes(array.flatten())
    if isinstance(array, pa.StructArray):
        return sum(_decoded_bytes(field) for field in array.flatten())
    return array.nbytes


def parquet_rows(path: Path) -> Iterator[Row]:
    import pyarrow as pa

    parquet, schema = _parquet_file(path)
    size = path.stat().st_size
    bound = max(PARQUET_MAX_EXPANSION * size, PARQUET_FREE_BYTES)
    read = decoded = 0
    try:
        for group in range(parquet.metadata.num_row_groups):
            for batch in parquet.iter_batches(row_groups=[group]):
                decoded += _decoded_bytes(batch)
                if decoded > bound:
                    raise UserError(
                        f"dataset {path}: its rows decode to more than {bound:,} bytes by row group {group}, over "
                        f"{PARQUET_MAX_EXPANSION:,} times the file's {size:,} bytes (and over {PARQUET_FREE_BYTES:,}): "
                        f"refused as a decompression bomb ({_AS_JSONL})")
                for item in batch.cast(schema).to_pylist():
                    read += 1
                    yield Row(str(path), read, item)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None


def parquet_head(path: Path, max_rows: int, max_bytes: int) -> tuple[list[Row], int]:
    """The first rows of a Parquet file, decoding at most max_bytes of them: whole rows, as many as fit."""
    import pyarrow as pa

    parquet, schema = _parquet_file(path)
    meta = parquet.metadata
    items: list[dict[str, Any]] = []
    left, over = max_bytes, 0
    try:
        for group in range(meta.num_row_groups):
            info = meta.row_group(group)
            if len(items) >= max_rows or over:
                break
            if not info.num_rows:
                continue
            # Rows' stored pages, on average: no more of them are decoded than could fit (strings stay dictionaries).
            per_row = sum(info.column(c).total_uncompressed_size for c in range(info.num_columns)) // info.num_rows
            if per_row > left:
                over = per_row
                break
            take = min(max_rows - len(items), info.num_rows, left // per_row if per_row else max_rows)
            batch = next(parquet.iter_batches(batch_size=take, row_groups=[group]))
            for n in range(batch.num_rows):
                row = batch.slice(n, 1)
                if (size := _decoded_bytes(row)) > left:
                    over = size
                    break
                left -= size
                items.extend(row.cast(schema).to_pylist())
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None
    if not items and over:
        return [Row(str(path), 1, None, f"is longer than the {max_bytes:,} bytes the preview reads of a file (a row "
                                        f"of it decodes to {over:,} bytes)")], meta.num_rows
    return [Row(str(path), n, item) for n, item in enumerate(items, start=1)], meta.num_rows
