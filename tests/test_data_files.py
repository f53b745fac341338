"""A user's data files: the CSV reader, NPZ and safetensors files, the stable hold-out, and a node's
data folder read at start and again as it grows (``dfl_node.learning.csv_reader``, ``data_files``,
``local_data``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dfl_node.errors import InputError
from dfl_node.learning import csv_reader
from dfl_node.learning.csv_reader import read_csv
from dfl_node.learning.data_files import read_samples
from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.datasets import ArrayDataset, load_shard, save_shard
from dfl_node.learning.local_data import LocalData, holdout, split_rows
from tests.helpers.data_files import blobs, write_csv


def rows(data: ArrayDataset) -> set[tuple[float, ...]]:
    return {tuple(r) for r in np.column_stack([data.x.reshape(len(data), -1).numpy(), data.y.numpy()]).tolist()}


def local(path: Path, **settings: object) -> LocalData:
    options: dict = {"val_fraction": 0.2, "max_samples": 0, "seed": 0, **settings}
    fmt = options.pop("fmt", DataFormat())
    return LocalData(path, fmt, **options)


def later(path: Path, seconds: int) -> None:
    """Mark ``path`` modified ``seconds`` after now: a folder's files are ordered by modification."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 10**9))


# ----------------------------------------------------------------------------- the CSV reader


def test_csv_reads_what_numpy_reads_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 1 KiB: rows cut at every block boundary, and a line longer than a block, read as numpy's own
    loadtxt reads the whole file (float32 for float32)."""
    monkeypatch.setattr(csv_reader, "BLOCK_BYTES", 1024)
    x, y = blobs(500, features=40)
    path = write_csv(tmp_path / "a.csv", x, y)
    table = read_csv(path)
    expected = np.loadtxt(path, dtype=np.float32, delimiter=",", skiprows=1)
    assert table.header == tuple(f"f{i}" for i in range(40)) + ("label",)
    assert np.array_equal(table.x, expected[:, :-1]) and table.x.dtype == np.float32
    assert np.array_equal(table.y, y) and table.y.dtype == np.int64


def test_an_error_names_the_row_of_the_file_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(csv_reader, "BLOCK_BYTES", 256)
    x, y = blobs(300)
    lines = write_csv(tmp_path / "a.csv", x, y).read_text().splitlines()
    lines[200] = lines[200].replace(",", ",x", 1)  # row 201 of the file, header = row 1
    (tmp_path / "b.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"^{tmp_path / 'b.csv'} row 201: column 'f1': 'x.*' is not a number$"):
        read_csv(tmp_path / "b.csv")


def test_label_column_by_name_by_number_or_last(tmp_path: Path) -> None:
    (tmp_path / "named.csv").write_text("class,a,b\n2,0.5,1\n0,1.5,2\n")
    table = read_csv(tmp_path / "named.csv", "class")
    assert table.y.tolist() == [2, 0] and table.x.tolist() == [[0.5, 1], [1.5, 2]]
    (tmp_path / "bare.csv").write_text("1,0.5,2\n0,1.5,0\n")
    assert read_csv(tmp_path / "bare.csv").y.tolist() == [2, 0]  # no header: the last column
    assert read_csv(tmp_path / "bare.csv", "0").y.tolist() == [1, 0]  # or by number
    assert read_csv(tmp_path / "bare.csv", "-3").x.tolist() == [[0.5, 2], [1.5, 0]]
    with pytest.raises(InputError, match="no header, so no column is named 'class'"):
        read_csv(tmp_path / "bare.csv", "class")
    with pytest.raises(InputError, match=r"no column 'label' in its header \(class, a, b\)"):
        read_csv(tmp_path / "named.csv")


def test_excel_files_quotes_blank_lines_and_an_unfinished_last_line(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b'\xef\xbb\xbfa,b,label\r\n"1.5",2,1\r\n\r\n3, 4 ,0\r\n5,6,1')
    table = read_csv(path)
    assert table.header == ("a", "b", "label") and table.x.tolist() == [[1.5, 2], [3, 4], [5, 6]]
    assert read_csv(path, complete_lines=True).y.tolist() == [1, 0]  # a file read while it grows: not the last


@pytest.mark.parametrize(("content", "problem"), [
    (b"a,b,label\n1,2,0\n3,4\n", " row 3: 2 columns, expected 3 as in its header"),
    (b"1,2,0\n3,4,5,1\n", " row 2: 4 columns, expected 3 as in its first row"),
    (b"a,b,label\n1,nan,0\n", " row 2: column 'b' is nan (NaN, infinities and values beyond float32 are not data)"),
    (b"a,b,label\n1,-inf,0\n", " row 2: column 'b' is -inf (NaN, infinities and values beyond float32 are not data)"),
    (b"a,b,label\n1,1e39,0\n", " row 2: column 'b' is 1e39 (NaN, infinities and values beyond float32 are not data)"),
    (b"a,b,label\n1,,0\n", " row 2: column 'b': '' is not a number"),
    (b"a,b,label\n1,2,0.5\n", " row 2: label 0.5 is not one of the classes (0..2)"),
    (b"a,b,label\n1,2,-1\n", " row 2: label -1 is not one of the classes (0..2)"),
    (b"a,b,label\n1,2,3\n", " row 2: label 3 is not one of the classes (0..2)"),
    (b"", ": empty file (no rows)"),
    (b"\n\n", ": empty file (no rows)"),
    (b"a,b,label\n", ": no rows of data (a header only)"),
    (b"label\n1\n", ": 1 column: a label and at least one feature are needed"),
    (b"a,b,label\n1,2,\xff\n", " row 2: not UTF-8 text (is it a CSV file?)"),
])
def test_each_malformed_csv_is_one_line_naming_the_row(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(content)
    with pytest.raises(InputError) as refused:
        read_csv(path, num_classes=3)
    assert str(refused.value) == f"{path}{problem}"


# ----------------------------------------------------------------------------- NPZ and safetensors files


def test_npz_keeps_its_sample_shape_and_sample_shape_reshapes_csv(tmp_path: Path) -> None:
    x = np.arange(5 * 6 * 4, dtype=np.float64).reshape(5, 6, 4)
    np.savez(tmp_path / "w.npz", x=x, y=np.array([0, 1, 2, 1, 0]))
    samples = read_samples(tmp_path / "w.npz", DataFormat())
    assert samples.sample_shape == (6, 4) and samples.x.dtype == np.float32 and np.array_equal(samples.x, x)
    write_csv(tmp_path / "w.csv", x.reshape(5, -1), np.array([0, 1, 2, 1, 0]))
    shaped = read_samples(tmp_path / "w.csv", DataFormat(sample_shape="6,4"))
    assert shaped.sample_shape == (6, 4) and np.array_equal(shaped.x, x)
    with pytest.raises(InputError, match=r"a sample holds 24 values \(24,\); --sample-shape 5,5 needs 25"):
        read_samples(tmp_path / "w.csv", DataFormat(sample_shape=[5, 5]))


@pytest.mark.parametrize(("arrays", "problem"), [
    ({"x": np.zeros((3, 2))}, r"an .npz file needs arrays x and y \(np.savez\(path, x=..., y=...\)\), it holds x"),
    ({"x": np.array([[0.0, np.nan]]), "y": np.array([0])}, r"x\[0\] holds NaN or an infinity"),
    ({"x": np.zeros((2, 2)), "y": np.array([0.0, 1.5])}, r"y\[1\] = 1.5 is not a class number"),
    ({"x": np.zeros((2, 2)), "y": np.array([0, 7])}, r"y\[1\] = 7 is not one of the classes \(0..2\)"),
    ({"x": np.zeros((2, 2)), "y": np.array([0])}, "x must be an array of numbers"),
    ({"x": np.array([[object()]]), "y": np.array([0])}, "not a readable .npz file"),  # pickled: refused
])
def test_each_malformed_npz_is_one_line(tmp_path: Path, arrays: dict, problem: str) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    with pytest.raises(InputError, match=f"^{path}: {problem}"):
        read_samples(path, DataFormat(), num_classes=3)


def test_a_shard_folder_reads_as_it_always_did_bit_for_bit(tmp_path: Path) -> None:
    train = ArrayDataset(torch.randn(40, 1, 8, 8), torch.randint(0, 10, (40,)), 10)
    val = ArrayDataset(torch.randn(9, 1, 8, 8), torch.randint(0, 10, (9,)), 10)
    save_shard(tmp_path / "train.safetensors", train, "digits")
    save_shard(tmp_path / "val.safetensors", val, "digits")
    view = local(tmp_path).load()
    for read, written in ((view.train, load_shard(tmp_path / "train.safetensors")),
                          (view.val, load_shard(tmp_path / "val.safetensors"))):
        assert torch.equal(read.x, written.x) and torch.equal(read.y, written.y)
        assert read.num_classes == 10 and read.x.dtype == torch.float32


def test_an_empty_shard_reads_as_no_samples(tmp_path: Path) -> None:
    """A shard of no samples (a hand-made validation file left empty) is read, not a reshape's crash: what a node
    does with no validation samples is its business (its local accuracy stays unknown)."""
    save_shard(tmp_path / "val.safetensors", ArrayDataset(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.int64),
                                                          10), "digits")
    samples = read_samples(tmp_path / "val.safetensors", DataFormat())
    assert samples.x.shape == (0, 1, 8, 8) and len(samples.y) == 0


def test_hand_made_shards_are_one_line(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(4, 6), "y": torch.zeros(4, dtype=torch.int64)}, str(tmp_path / "nometa.safetensors"))
    with pytest.raises(InputError, match="nometa.safetensors: metadata 'num_classes' missing"):
        read_samples(tmp_path / "nometa.safetensors", DataFormat())
    save_file({"x": torch.zeros(4, 6, dtype=torch.float64), "y": torch.zeros(4, dtype=torch.int64)},
              str(tmp_path / "f64.safetensors"), metadata={"num_classes": "3"})
    with pytest.raises(InputError, match=r"f64.safetensors: 'x' must be float32 \(N, \*sample shape\)"):
        read_samples(tmp_path / "f64.safetensors", DataFormat())


# ----------------------------------------------------------------------------- the hold-out


def test_holdout_is_stratified_seeded_and_stable_as_a_file_grows() -> None:
    y = np.random.default_rng(1).integers(0, 5, 1000)
    held = holdout(y, 0.2, seed=7, key="a.csv")
    for c in range(5):
        assert abs(held[y == c].sum() - 0.2 * (y == c).sum()) <= 1  # every class, to one sample
    assert np.array_equal(held, holdout(y, 0.2, seed=7, key="a.csv"))  # deterministic
    assert not np.array_equal(held, holdout(y, 0.2, seed=8, key="a.csv"))  # seeded
    grown = np.concatenate([y, np.random.default_rng(2).integers(0, 5, 700)])
    assert np.array_equal(holdout(grown, 0.2, seed=7, key="a.csv")[:1000], held)  # no sample changes side


# ----------------------------------------------------------------------------- a node's data folder


def test_a_folder_without_a_validation_file_holds_back_a_share(tmp_path: Path) -> None:
    write_csv(tmp_path / "a.csv", *blobs(100, seed=1))
    write_csv(tmp_path / "b.csv", *blobs(50, seed=2))
    (tmp_path / "test.csv").write_text("not read: the global test set is --test-data\n")
    (tmp_path / "notes.txt").write_text("not data\n")
    view = local(tmp_path).load()
    assert len(view.train) + len(view.val) == 150 and view.files == 2
    assert abs(len(view.val) - 30) <= 3 * 2  # to one sample per class and file
    assert view.train.input_shape == (4,) and view.train.num_classes == 3


def test_a_validation_file_replaces_the_holdout(tmp_path: Path) -> None:
    write_csv(tmp_path / "a.csv", *blobs(100, seed=1))
    write_csv(tmp_path / "val.csv", *blobs(10, seed=2))
    view = local(tmp_path).load()
    assert (len(view.train), len(view.val)) == (100, 10)


def test_the_folder_grows_new_samples_join_and_none_changes_side(tmp_path: Path) -> None:
    x, y = blobs(400, seed=3)
    write_csv(tmp_path / "a.csv", x[:200], y[:200])
    data = local(tmp_path)
    before = data.load()
    assert data.refresh(data.scan()) == (None, [])  # nothing changed: nothing read
    write_csv(tmp_path / "a.csv", x, y)  # the file grew
    later(tmp_path / "a.csv", 1)
    after, problems = data.refresh(data.scan())
    assert problems == [] and after is not None
    assert len(after.train) + len(after.val) == 400 and abs(len(after.val) - 80) <= 3
    assert rows(before.val) <= rows(after.val) and rows(before.train) <= rows(after.train)


def test_a_bad_file_is_skipped_once_and_the_data_it_had_stays(tmp_path: Path) -> None:
    x, y = blobs(300, seed=4)
    write_csv(tmp_path / "a.csv", x[:100], y[:100])
    data = local(tmp_path, fmt=DataFormat(num_classes=3))
    first = data.load()
    lines = write_csv(tmp_path / "a.csv", x[:200], y[:200]).read_text().splitlines()
    lines[150] = lines[150] + ",9"  # row 151: a column too many
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    later(tmp_path / "a.csv", 1)
    write_csv(tmp_path / "b.csv", x[200:], y[200:])
    later(tmp_path / "b.csv", 2)
    view, problems = data.refresh(data.scan())
    assert problems == [f"{tmp_path / 'a.csv'} row 151: 6 columns, expected 5 as in its header"]
    assert view is not None and len(view.train) + len(view.val) == 200  # a.csv's first 100 rows, b.csv's 100
    assert rows(first.train) <= rows(view.train)
    assert data.skipped == {"a.csv": problems[0]}
    assert data.refresh(data.scan()) == (None, [])  # that version is not read (nor reported) again
    write_csv(tmp_path / "a.csv", x[:200], y[:200])  # fixed
    later(tmp_path / "a.csv", 3)
    fixed, problems = data.refresh(data.scan())
    assert problems == [] and fixed is not None and len(fixed.train) + len(fixed.val) == 300
    assert data.skipped == {}


@pytest.mark.parametrize(("content", "problem"), [
    ("f0,f1,f2,f3,f4,label\n1,2,3,4,5,0\n", r"samples of shape \(5,\), this node's data has \(4,\)"),
    ("f0,f1,f2,f3,label\n1,2,3,4,3\n", r"row 2: label 3 is not one of the classes \(0..2\)"),
    ("", "empty file"),
])
def test_files_that_do_not_fit_the_node_are_skipped_while_it_runs(tmp_path: Path, content: str,
                                                                  problem: str) -> None:
    write_csv(tmp_path / "a.csv", *blobs(60, seed=5))
    data = local(tmp_path)
    assert data.load().train.num_classes == 3  # inferred: labels 0..2
    (tmp_path / "b.csv").write_text(content)
    view, problems = data.refresh(data.scan())
    assert view is None and len(problems) == 1 and re.search(problem, problems[0]), problems


def test_max_samples_keeps_the_newest(tmp_path: Path) -> None:
    x, y = blobs(300, seed=6)
    write_csv(tmp_path / "old.csv", x[:200], y[:200])
    write_csv(tmp_path / "new.csv", x[200:], y[200:])
    later(tmp_path / "new.csv", 5)
    view = local(tmp_path, max_samples=150).load()
    old, new = read_csv(tmp_path / "old.csv"), read_csv(tmp_path / "new.csv")
    newest = {tuple(r) for r in np.column_stack([np.concatenate([old.x[150:], new.x]),
                                                 np.concatenate([old.y[150:], new.y])]).tolist()}
    assert rows(view.train) | rows(view.val) == newest


def test_labels_beyond_the_declared_classes_and_a_single_class_are_refused(tmp_path: Path) -> None:
    write_csv(tmp_path / "a.csv", *blobs(30, seed=7))
    with pytest.raises(InputError, match=r"a.csv row \d+: label 2 is not one of the classes \(0..1\)"):
        local(tmp_path, fmt=DataFormat(num_classes=2)).load()
    write_csv(tmp_path / "a.csv", np.zeros((5, 2)), np.zeros(5, int))
    with pytest.raises(InputError, match="every label is 0, a single class; give --num-classes"):
        local(tmp_path).load()


def test_split_rows_moves_the_held_rows_last_in_place() -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10)
    held = np.zeros(10, bool)
    held[[1, 4, 5, 9]] = True
    split_rows(x, y, held, chunk=2)
    assert y.tolist() == [0, 2, 3, 6, 7, 8, 1, 4, 5, 9] and np.array_equal(x[:, 0], 2 * y)


def test_a_files_samples_are_held_once_in_memory(tmp_path: Path) -> None:
    """Its training and validation sets are views of the rows as read, not copies (the benchmark's peak)."""
    write_csv(tmp_path / "a.csv", *blobs(200, seed=8))
    view = local(tmp_path).load()
    assert view.val.x.data_ptr() == view.train.x.data_ptr() + view.train.x.nbytes  # one buffer: train, then val


def test_a_validation_file_that_comes_or_goes_rereads_the_training_files(tmp_path: Path) -> None:
    write_csv(tmp_path / "a.csv", *blobs(100, seed=9))
    data = local(tmp_path)
    assert len(data.load().train) < 100  # its hold-out validates
    write_csv(tmp_path / "val.csv", *blobs(10, seed=10))
    view, _ = data.refresh(data.scan())
    assert view is not None and (len(view.train), len(view.val)) == (100, 10)
    (tmp_path / "val.csv").unlink()
    view, _ = data.refresh(data.scan())
    assert view is not None and len(view.train) < 100 and len(view.train) + len(view.val) == 100


def test_a_file_gone_between_the_look_and_the_read_is_skipped(tmp_path: Path) -> None:
    write_csv(tmp_path / "a.csv", *blobs(50, seed=11))
    data = local(tmp_path)
    data.load()
    write_csv(tmp_path / "b.csv", *blobs(50, seed=12))
    versions = data.scan()
    (tmp_path / "b.csv").unlink()
    assert data.refresh(versions) == (None, [f"{tmp_path / 'b.csv'}: cannot read it (No such file or directory)"])
