"""Every dataset layout ``plan --dataset`` reads, written as real files: JSON lines, JSON (a list, columns, rows
under a key), CSV and TSV, parquet and arrow (pyarrow), a ``save_to_disk`` folder and a ``datasets`` cache folder
(made by the real ``datasets`` library), a hub id found in the local caches, folders of several splits, and files
that cannot be read (one line each)."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

from vramscope.dataset import DatasetError, dataset_plan_input
from vramscope.dataset.files import locate
from vramscope.dataset.readers import read_rows

ROWS = [{"text": f"example {i} " + "word " * i, "id": i} for i in range(12)]
TEXTS = [r["text"] for r in ROWS]


def read_texts(name: str, split: str | None = None) -> list[str]:
    located = locate(name, split)
    return [str(v) for v in read_rows(located.files).values("text")]


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_json_lines(tmp_path: Path) -> None:
    assert read_texts(str(write_jsonl(tmp_path / "d.jsonl", ROWS))) == TEXTS


def test_json_as_a_list_as_columns_and_as_rows_under_a_key(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text(json.dumps(ROWS))
    (tmp_path / "columns.json").write_text(json.dumps({"text": TEXTS, "id": list(range(12))}))
    (tmp_path / "keyed.json").write_text(json.dumps({"version": 1, "data": ROWS}))
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in ROWS))  # datasets reads these too
    for name in ("list", "columns", "keyed", "lines"):
        assert read_texts(str(tmp_path / f"{name}.json")) == TEXTS, name


def test_csv_and_tsv_with_newlines_in_cells(tmp_path: Path) -> None:
    rows = [{"text": t + "\nsecond line, with a comma", "id": i} for i, t in enumerate(TEXTS)]
    for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):
        with open(tmp_path / f"d{suffix}", "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=["text", "id"], delimiter=delimiter)
            w.writeheader()
            w.writerows(rows)
        assert read_texts(str(tmp_path / f"d{suffix}")) == [r["text"] for r in rows]


def test_parquet_and_arrow_files(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(ROWS)
    pq.write_table(table, tmp_path / "d.parquet")
    with pa.OSFile(str(tmp_path / "stream.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)  # the IPC stream format, as datasets writes its arrow files
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)  # the IPC file format
    for name in ("d.parquet", "stream.arrow", "file.arrow"):
        assert read_texts(str(tmp_path / name)) == TEXTS, name


def save_to_disk(rows: list[dict[str, object]], folder: Path) -> None:
    """``Dataset.save_to_disk`` by the real ``datasets`` where installed, else its layout written with pyarrow: the
    arrow IPC stream, state.json naming it, dataset_info.json."""
    try:
        import datasets
    except ImportError:
        import pyarrow as pa

        folder.mkdir(parents=True)
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
        (folder / "dataset_info.json").write_text("{}")
        return
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))


def test_a_save_to_disk_folder(tmp_path: Path) -> None:
    save_to_disk(ROWS, tmp_path / "one")
    assert read_texts(str(tmp_path / "one")) == TEXTS
    save_to_disk(ROWS, tmp_path / "dict" / "train")
    save_to_disk(ROWS[:3], tmp_path / "dict" / "test")
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert read_texts(str(tmp_path / "dict")) == TEXTS  # train by default
    assert read_texts(str(tmp_path / "dict"), "test") == TEXTS[:3]
    with pytest.raises(DatasetError, match="no split 'dev'; it has"):
        locate(str(tmp_path / "dict"), "dev")


def test_a_dataset_dict_saved_by_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    both = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                                 "test": datasets.Dataset.from_list(ROWS[:3])})
    both.save_to_disk(str(tmp_path / "dict"))
    assert read_texts(str(tmp_path / "dict")) == TEXTS
    assert read_texts(str(tmp_path / "dict"), "test") == TEXTS[:3]


def _datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real ``load_dataset`` cache folder (json builder) under a private HF_DATASETS_CACHE."""
    datasets = pytest.importorskip("datasets")
    cache = tmp_path / "hf-datasets"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    data = write_jsonl(tmp_path / "src" / "train.jsonl", ROWS)
    ds = datasets.load_dataset("json", data_files={"train": str(data)}, cache_dir=str(cache))
    ds["train"].map(lambda r: {"n": len(r["text"])})  # leaves a cache-*.arrow beside the split file
    (builder,) = {p.parent for p in cache.rglob("dataset_info.json")}
    return builder


def test_a_datasets_cache_folder_and_a_hub_id_found_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builder = _datasets_cache(tmp_path, monkeypatch)
    assert any(p.name.startswith("cache-") for p in builder.glob("*.arrow"))
    assert read_texts(str(builder)) == TEXTS  # the split file, not the map cache
    # The layout load_dataset("someorg/somedata") leaves: <cache>/someorg___somedata/<config>/<version>/<hash>/
    hub = Path(str(builder.parents[3])) / "someorg___somedata" / "default" / "0.0.0" / "abc123"
    hub.mkdir(parents=True)
    shutil.copy(builder / "dataset_info.json", hub)
    shutil.copy(next(builder.glob("json-train*.arrow")), hub / "somedata-train.arrow")
    located = locate("someorg/somedata")
    assert located.note is not None and "local datasets cache" in located.note
    assert read_texts("someorg/somedata") == TEXTS


def test_a_hub_id_in_the_hub_cache_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "datasets--org--data"
    snap = repo / "snapshots" / "0123abcd"
    (snap / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ROWS), snap / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), snap / "data" / "test-00000-of-00001.parquet")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    assert read_texts("org/data") == TEXTS
    assert read_texts("org/data", "test") == TEXTS[:2]


def test_a_hub_id_not_in_any_cache_is_one_line_and_nothing_is_downloaded(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "b"))
    with pytest.raises(DatasetError) as err:
        locate("tatsu-lab/alpaca")
    assert "never downloads" in str(err.value) and "\n" not in str(err.value)


def test_a_folder_of_splits_reads_train_or_the_split_or_file_named(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d" / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "d" / "test.jsonl", ROWS[:4])
    assert read_texts(str(tmp_path / "d")) == TEXTS
    assert read_texts(str(tmp_path / "d"), "test") == TEXTS[:4]
    assert read_texts(str(tmp_path / "d"), "test.jsonl") == TEXTS[:4]
    # several shards of one split are read together, in order
    write_jsonl(tmp_path / "s" / "part-0.jsonl", ROWS[:6])
    write_jsonl(tmp_path / "s" / "part-1.jsonl", ROWS[6:])
    assert read_texts(str(tmp_path / "s")) == TEXTS


def test_a_folder_of_splits_without_train_asks_for_one(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d" / "test.jsonl", ROWS)
    write_jsonl(tmp_path / "d" / "validation.jsonl", ROWS)
    with pytest.raises(DatasetError, match=r"several splits \(test, validation\): pass --dataset-split NAME"):
        locate(str(tmp_path / "d"))


def test_without_pyarrow_json_lines_and_csv_still_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError, as where it is missing
    assert read_texts(str(write_jsonl(tmp_path / "d.jsonl", ROWS))) == TEXTS
    (tmp_path / "d.csv").write_text("text,id\n" + "".join(f"{t},{i}\n" for i, t in enumerate(TEXTS)))
    assert read_texts(str(tmp_path / "d.csv")) == TEXTS
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(DatasetError, match="needs pyarrow"):
        read_rows([tmp_path / "d.parquet"])


@pytest.mark.parametrize("name, content, words", [
    ("bad.jsonl", '{"text": "a"}\n{"text": \n', "bad.jsonl:2: not JSON"),
    ("bad.parquet", "not a parquet file", "cannot read it as parquet"),
    ("bad.json", "[1, 2, 3]", "a JSON dataset must be a list of objects"),
    ("bad.arrow", "garbage", "cannot read it as arrow"),
])
def test_a_broken_file_is_one_line(tmp_path: Path, name: str, content: str, words: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(DatasetError) as err:
        dataset_plan_input(str(tmp_path / name), batch=2)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_what_is_not_a_dataset_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    for name, words in ((tmp_path / "notes.txt", "not a data file"), (tmp_path / "empty", "no data files"),
                        (tmp_path / "missing.jsonl", "no such file or folder")):
        with pytest.raises(DatasetError, match=words):
            locate(str(name))
