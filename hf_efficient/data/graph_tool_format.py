"""Read graph-tool's binary ``.gt`` format (https://graph-tool.skewed.de/static/doc/gt_format.html).

Layout (little- or big-endian as its flag says): the magic ``b"\\xe2\\x9b\\xbe gt"``, a version byte (1), an
endianness byte (0 = little), a comment (uint64 length + UTF-8), a directed byte, the number of vertices N
(uint64), then per vertex its out-degree (uint64) and its out-neighbours as unsigned ints of the smallest
width holding N - 1 (1, 2, 4 or 8 bytes), then the property maps: their count (uint64) and, for each, its
kind (0 graph, 1 vertex, 2 edge), its name (uint64 length + bytes), a value-type byte and the values (one for
a graph property, N for a vertex one, E in adjacency order for an edge one). Value types: 0 bool (1 byte),
1 int16, 2 int32, 3 int64, 4 double, 5 long double (16 bytes), 6 string (uint64 length + bytes), 7-12 vectors
of types 0-5 and 13 vectors of strings (uint64 length + elements), 14 a Python object (pickled, as a string;
returned as raw bytes, never unpickled).
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"\xe2\x9b\xbe gt"
_SCALARS = {0: "u1", 1: "i2", 2: "i4", 3: "i8", 4: "f8", 5: "V16"}  # 5: long double, kept as raw 16 bytes
PROPERTY_KINDS = ("graph", "vertex", "edge")


class _Reader:
    def __init__(self, data: bytes, order: str):
        self.data, self.pos, self.order = data, 0, order

    def array(self, code: str, count: int) -> np.ndarray:
        dtype = np.dtype(code).newbyteorder(self.order)
        out = np.frombuffer(self.data, dtype, count=count, offset=self.pos)
        self.pos += dtype.itemsize * count
        return out

    def uint64(self) -> int:
        return int(self.array("u8", 1)[0])

    def string(self) -> bytes:
        length = self.uint64()
        self.pos += length
        return self.data[self.pos - length : self.pos]

    def values(self, value_type: int, count: int) -> Any:
        """``count`` values of a type: a numpy array for scalar types, else a list."""
        if value_type in _SCALARS:
            return self.array(_SCALARS[value_type], count)
        if value_type in (6, 14):
            strings = [self.string() for _ in range(count)]
            return [s.decode("utf-8", "replace") for s in strings] if value_type == 6 else strings
        if 7 <= value_type <= 12:
            return [self.array(_SCALARS[value_type - 7], self.uint64()) for _ in range(count)]
        if value_type == 13:
            return [
                [s.decode("utf-8", "replace") for s in self.values(14, self.uint64())] for _ in range(count)
            ]
        raise ValueError(f"Unknown .gt value type {value_type}.")


def read_gt(source: str | Path | bytes) -> dict[str, Any]:
    """Parse a ``.gt`` / ``.gt.gz`` file (a path or its bytes).

    Returns:
        ``{"num_nodes": N, "directed": bool, "edge_index": (2, E) int64 in file order (source, target),
        "graph": {...}, "vertex": {name: N values}, "edge": {name: E values}, "comment": str}``.
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if data[:6] != MAGIC:
        raise ValueError(f"Not a graph-tool .gt file (magic bytes {data[:6]!r}, expected {MAGIC!r}).")
    version, big_endian = data[6], data[7]
    if version != 1:
        raise ValueError(f"Unsupported .gt version {version} (only version 1 is known).")
    reader = _Reader(data, ">" if big_endian else "<")
    reader.pos = 8
    comment = reader.string().decode("utf-8", "replace")
    directed = bool(reader.array("u1", 1)[0])
    num_nodes = reader.uint64()
    width = next(
        code for code, bits in (("u1", 8), ("u2", 16), ("u4", 32), ("u8", 64)) if num_nodes <= 2**bits
    )
    sources, targets = [], []
    for vertex in range(num_nodes):
        neighbours = reader.array(width, reader.uint64())
        sources.append(np.full(neighbours.size, vertex, dtype=np.int64))
        targets.append(neighbours.astype(np.int64))
    edge_index = (
        np.stack([np.concatenate(sources), np.concatenate(targets)]) if num_nodes else np.zeros((2, 0))
    )
    counts = {"graph": 1, "vertex": num_nodes, "edge": edge_index.shape[1]}
    properties: dict[str, dict[str, Any]] = {kind: {} for kind in PROPERTY_KINDS}
    for _ in range(reader.uint64()):
        kind = PROPERTY_KINDS[reader.array("u1", 1)[0]]
        name = reader.string().decode("utf-8", "replace")
        values = reader.values(int(reader.array("u1", 1)[0]), counts[kind])
        properties[kind][name] = values[0] if kind == "graph" else values
    if reader.pos != len(data):
        raise ValueError(f".gt file has {len(data) - reader.pos} unread bytes at the end (corrupt?).")
    return {
        "num_nodes": num_nodes,
        "directed": directed,
        "edge_index": edge_index.astype(np.int64),
        **properties,
        "comment": comment,
    }
