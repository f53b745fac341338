"""A CSV file of numeric columns → float32 features and int64 labels (or float32 targets): fast, lean and strict.

Fast: numpy's C parser (``numpy.loadtxt``) reads the file block by block, within 1.2× of pandas' ``read_csv``
into float32 here (``benchmarks/read_csv.py``), with no dependency beyond numpy. Lean: the rows are counted first,
the arrays allocated once, and each parsed block copied into them: peak memory is the arrays plus one block (1 MiB
of text), not a list of Python objects per cell nor a float64 copy. Strict: whatever numpy refuses or the checks
find (a cell that is not a number, NaN or an infinity, a row of other length, a label that is not a class number)
is read again, line by line in Python, to say in one line which file, row and column; that slow path runs only
for a block with a problem.

A row is a line of the file, counted from 1 with the header: what an editor or ``sed -n 17p`` shows. Empty lines
are skipped. Cells are separated by commas and may be quoted (``"1.5"``).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from dfl_node.errors import InputError
from dfl_node.learning.data_format import DEFAULT_LABEL_COLUMN

BLOCK_BYTES = 1 << 20
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_LARGEST_LABEL = 1 << 24  # labels travel as float32 through the parser: exact up to here


@dataclass(frozen=True)
class CsvTable:
    x: np.ndarray  # float32 (N, F): every column but the label's (the targets')
    y: np.ndarray  # int64 (N,): the label column; or float32 (N, T): the target columns, in the order named
    header: tuple[str, ...] | None  # the header's cells, if the file has one


@dataclass(frozen=True)
class _Layout:
    path: Path | str  # what the messages name
    columns: int
    labels: tuple[int, ...]  # the label's column, or the targets'; none: every column is a feature (to predict)
    header: tuple[str, ...] | None
    num_classes: int | None
    targets: bool = False  # float targets (regression), not class labels

    def name(self, column: int) -> str:
        return repr(self.header[column]) if self.header else str(column + 1)


def read_csv(path: Path, label_column: str = DEFAULT_LABEL_COLUMN, *, num_classes: int | None = None,
             complete_lines: bool = False, targets: Sequence[str] = ()) -> CsvTable:
    """Read ``path``; labels must be whole numbers ≥ 0 (and < ``num_classes``, if given); or, with ``targets``
    (column names or numbers), those columns are read as float targets, in that order. ``complete_lines``: a
    last line without its newline is left out, as one a writer has not finished (a file read while it grows).
    Raises :class:`InputError` naming the file and row."""
    def columns_of(header: tuple[str, ...] | None, columns: int) -> tuple[int, ...]:
        wanted = list(targets) or [label_column]
        if columns <= len(wanted):
            what = "the targets" if targets else "a label"
            raise InputError(f"{path}: {columns} column{'s' * (columns != 1)}: {what} and at least one feature are "
                             "needed")
        found = tuple(_label_index(path, name, header, columns, "--target-column" if targets else "--label-column")
                      for name in wanted)
        if len(set(found)) != len(found):
            raise InputError(f"{path}: a target column is named twice ({', '.join(wanted)})")
        return found

    with open(path, "rb") as f:
        return _read(f, path, columns_of, num_classes, complete_lines, bool(targets))


def read_series(path: Path, targets: Sequence[str], *,
                complete_lines: bool = False) -> tuple[np.ndarray, list[int]]:
    """A time series (a row a step, a column a channel), float32 (steps, channels), every column, and the columns
    of the ``targets`` named (by header name or number; none: the last column), checked as :func:`read_csv` checks."""
    found: list[int] = []

    def columns_of(header: tuple[str, ...] | None, columns: int) -> tuple[int, ...]:
        found.extend(_label_index(path, name, header, columns, "--target-column")
                     for name in (targets or [str(columns - 1)]))
        return ()

    with open(path, "rb") as f:
        return _read(f, path, columns_of, None, complete_lines).x, found


def read_features(f: BinaryIO, name: str, drop_column: str = DEFAULT_LABEL_COLUMN) -> np.ndarray:
    """Samples to classify, float32 (N, F): every column of ``f`` (a seekable binary file named ``name`` in the
    messages) but the one its header names ``drop_column`` (a training file's label), checked as :func:`read_csv`
    checks its features."""
    def label(header: tuple[str, ...] | None, columns: int) -> tuple[int, ...]:
        return (header.index(drop_column),) if header is not None and drop_column in header else ()

    return _read(f, name, label, None, False).x


def _read(f: BinaryIO, path: Path | str, labels_of: Callable[[tuple[str, ...] | None, int], tuple[int, ...]],
          num_classes: int | None, complete_lines: bool, targets: bool = False) -> CsvTable:
    first, first_row, data_start, after_first = _first_line(f, path)
    cells = _cells(first, path, first_row)
    header = tuple(c.strip().strip('"') for c in cells) if not any(_number(c) is not None for c in cells) else None
    columns = len(cells)
    layout = _Layout(path, columns, labels_of(header, columns), header, num_classes, targets)
    if header is not None:
        data_start, first_row = after_first, first_row + 1
    rows = _count_rows(f, data_start)
    if rows == 0:
        raise InputError(f"{path}: no rows of data" + (" (a header only)" if header else ""))
    x = np.empty((rows, columns - len(layout.labels)), np.float32)
    y = (np.empty((rows, len(layout.labels)), np.float32) if targets
         else np.empty(rows if layout.labels else 0, np.int64))
    f.seek(data_start)
    done = _parse(f, layout, x, y, complete_lines, lambda offset: first_row + _newlines(f, data_start, offset))
    if done == 0:
        raise InputError(f"{path}: no rows of data" + (" (a header only)" if header else ""))
    return CsvTable(x[:done], y[:done], header)


def _first_line(f: BinaryIO, path: Path | str) -> tuple[bytes, int, int, int]:
    """The first line that is not empty (without its newline or a UTF-8 byte-order mark), its row number, where
    it starts and where the next line starts."""
    row, start = 1, 0
    for raw in f:
        if row == 1 and raw.startswith(b"\xef\xbb\xbf"):  # Excel's byte-order mark
            raw, start = raw[3:], 3
        line = raw.rstrip(b"\r\n")
        if line.strip():
            return line, row, start, start + len(raw)
        row, start = row + 1, start + len(raw)
    raise InputError(f"{path}: empty file (no rows)")


def _cells(line: bytes, path: Path | str, row: int) -> list[str]:
    try:
        return line.decode("utf-8").split(",")
    except UnicodeDecodeError:
        raise InputError(f"{path} row {row}: not UTF-8 text (is it a CSV file?)") from None


def _label_index(path: Path, label_column: str, header: tuple[str, ...] | None, columns: int,
                 flag: str = "--label-column") -> int:
    """The label's (a target's) column: named in the header, else a column number, else (no header, default name)
    the last."""
    if header is not None and label_column in header:
        return header.index(label_column)
    try:
        number = int(label_column)
    except ValueError:
        number = None
    if number is not None:
        if not -columns <= number < columns:
            raise InputError(f"{path}: {flag} {number} is not one of its {columns} columns "
                             f"(0..{columns - 1}, or -1 for the last)")
        return number % columns
    if header is None:
        if label_column == DEFAULT_LABEL_COLUMN:
            return columns - 1
        raise InputError(f"{path}: no header, so no column is named {label_column!r}; give the column by number "
                         f"({flag} 0 for the first, -1 for the last)")
    shown = ", ".join(header[:10]) + (", …" if len(header) > 10 else "")
    raise InputError(f"{path}: no column {label_column!r} in its header ({shown}); name the column with {flag}")


def _count_rows(f: BinaryIO, start: int) -> int:
    """Lines from ``start`` on (empty ones included: an upper bound), counting an unterminated last one."""
    f.seek(start)
    count, last = 0, b"\n"
    while block := f.read(BLOCK_BYTES):
        count += block.count(b"\n")
        last = block[-1:]
    return count + (last != b"\n")


def _newlines(f: BinaryIO, start: int, end: int) -> int:
    """The line breaks between two offsets of the file (the row of a block with a problem: the slow path only)."""
    position = f.tell()
    f.seek(start)
    count = f.read(end - start).count(b"\n")
    f.seek(position)
    return count


def _parse(f: BinaryIO, layout: _Layout, x: np.ndarray, y: np.ndarray, complete_lines: bool,
           row_at: Callable[[int], int]) -> int:
    """Parse the file from its position in blocks of whole lines into ``x`` and ``y``; the rows filled. A block
    with a problem is read again by :func:`_locate`, which names its row (``row_at`` its file offset)."""
    filled, pending, offset = 0, b"", f.tell()
    while True:
        block = f.read(BLOCK_BYTES)
        data = pending + block
        if block:
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # a line longer than a block: read on
                pending = data
                continue
            data, pending = data[:cut], data[cut:]
        elif complete_lines:
            data = b""  # the writer's unfinished last line: next time
        if data and not data.isspace():
            try:
                filled += _parse_block(data, layout, x, y, filled)
            except ValueError as exc:
                raise _locate(data, layout, row_at(offset), str(exc)) from None
        offset += len(data)
        if not block:
            return filled


def _parse_block(data: bytes, layout: _Layout, x: np.ndarray, y: np.ndarray, at: int) -> int:
    """One block of whole lines into ``x``/``y`` from index ``at``; its row count. A ValueError: a problem in it."""
    values = np.loadtxt(io.BytesIO(data), dtype=np.float32, delimiter=",", ndmin=2, comments=None, quotechar='"')
    if values.shape[1] != layout.columns or not np.isfinite(values).all():
        raise ValueError("")
    count, labels = len(values), list(layout.labels)
    if not layout.targets and labels and not _are_classes(values[:, labels[0]], layout.num_classes):
        raise ValueError("")
    x[at:at + count] = np.delete(values, labels, axis=1) if labels else values
    if labels:
        y[at:at + count] = values[:, labels] if layout.targets else values[:, labels[0]]
    return count


def _are_classes(labels: np.ndarray, num_classes: int | None) -> bool:
    top = _LARGEST_LABEL if num_classes is None else num_classes
    return bool(((labels >= 0) & (labels < top) & (labels == np.floor(labels))).all())


def _number(cell: str) -> float | None:
    """A cell as numpy reads it (spaces and quotes around it allowed), or None if it is not a number."""
    text = cell.strip().strip('"').strip()
    if not text or "_" in text:  # Python's float() takes 1_000; numpy does not
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _locate(data: bytes, layout: _Layout, row: int, parser_said: str) -> InputError:
    """The first problem of a block, as one line naming the file, the row and the column."""
    path = layout.path
    for offset, raw in enumerate(data.split(b"\n")):
        line, at = raw.rstrip(b"\r"), row + offset
        if not line:
            continue
        cells = _cells(line, path, at)
        if len(cells) != layout.columns:
            return InputError(f"{path} row {at}: {len(cells)} columns, expected {layout.columns} as in "
                              f"{'its header' if layout.header else 'its first row'}")
        for column, cell in enumerate(cells):
            value = _number(cell)
            if value is None:
                return InputError(f"{path} row {at}: column {layout.name(column)}: {cell.strip()[:40]!r} is not a "
                                  f"number")
            if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
                return InputError(f"{path} row {at}: column {layout.name(column)} is {cell.strip()[:40]} (NaN, "
                                  f"infinities and values beyond float32 are not data)")
        if not layout.labels or layout.targets:
            continue
        label = _number(cells[layout.labels[0]])
        if not _are_classes(np.array([label], np.float32), layout.num_classes):
            classes = f"0..{layout.num_classes - 1}" if layout.num_classes else "0, 1, 2, …"
            return InputError(f"{path} row {at}: label {cells[layout.labels[0]].strip()[:40]} is not one of the "
                              f"classes ({classes})")
    last = row + data.count(b"\n") - 1
    return InputError(f"{path} rows {row}..{last}: not numeric CSV ({parser_said or 'unread'})")
