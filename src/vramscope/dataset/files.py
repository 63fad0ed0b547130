"""Where a dataset's rows are: a file, a folder of files, a ``save_to_disk`` folder, or a hub dataset already in
the local Hugging Face cache. Nothing is ever downloaded.

:func:`locate` turns what the user named into the data files to read (one split), or a one-line
:class:`DatasetError` that says what to pass instead.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramscope.dataset.types import DatasetError

# Data file suffixes -> the reader's format name.
SUFFIXES: dict[str, str] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv",
    ".parquet": "parquet", ".arrow": "arrow",
}
SPLIT_WORDS: dict[str, str] = {
    "train": "train", "training": "train", "test": "test", "testing": "test", "validation": "validation",
    "valid": "validation", "val": "validation", "dev": "validation", "eval": "validation",
}
_SPLIT_RE = re.compile(r"(?:^|[-_./])(train|training|test|testing|validation|valid|val|dev|eval)(?=$|[-_./\d])")
MAX_DEPTH = 4  # a hub snapshot keeps its files in data/ or <config>/; deeper is not a dataset layout


@dataclass(frozen=True)
class Located:
    """The data files of one split, and how they were found."""

    source: str  # what the user named, or the cache folder a hub id resolved to
    files: tuple[Path, ...]
    split: str | None
    note: str | None = None  # "the hub dataset tatsu-lab/alpaca from the local cache ..."


def locate(name: str, split: str | None = None) -> Located:
    """The files to read for ``name`` (a path, or a hub id found in the local cache), one split of them.

    Args:
        name: a data file, a folder (of files, or written by ``save_to_disk``, or a cache folder), or a hub id
            (``tatsu-lab/alpaca``) whose files are already in the local Hugging Face cache.
        split: the split to read (``train`` when there are several and none is given), or a file's name in the
            folder.

    Raises:
        DatasetError: nothing readable there, several splits with none chosen, an unknown split.
    """
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise DatasetError(f"{name}: not a data file vramscope reads (JSON lines, JSON, CSV, parquet, arrow)")
        return Located(name, (path,), None)
    if path.is_dir():
        return _folder(path, name, split)
    if not path.exists() and _looks_like_hub_id(name):
        return _from_cache(name, split)
    raise DatasetError(f"{name}: no such file or folder")


def _looks_like_hub_id(name: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) is not None and not name.endswith(tuple(SUFFIXES))


def _folder(path: Path, source: str, split: str | None) -> Located:
    dict_file = path / "dataset_dict.json"
    if dict_file.is_file():  # DatasetDict.save_to_disk: one save_to_disk folder per split
        splits = [str(s) for s in _json(dict_file).get("splits", [])]
        chosen = _choose(splits, split, source)
        inner = _folder(path / chosen, source, None)
        return Located(source, inner.files, chosen, inner.note)
    state = path / "state.json"
    if state.is_file():  # Dataset.save_to_disk: arrow files (IPC streams) named in state.json
        names = [str(f.get("filename")) for f in _json(state).get("_data_files", []) if isinstance(f, dict)]
        files = tuple(path / n for n in names if (path / n).is_file())
        if not files:
            raise DatasetError(f"{source}: state.json names no arrow file that is there; save the dataset again")
        return Located(source, files, split)
    if (path / "dataset_info.json").is_file() and any(path.glob("*.arrow")):
        return _builder_folder(path, source, split)
    return _data_folder(path, source, split)


def _builder_folder(path: Path, source: str, split: str | None) -> Located:
    """A ``datasets`` cache folder: ``<builder>-<split>.arrow`` or ``<builder>-<split>-00000-of-00002.arrow``;
    the ``cache-*.arrow`` files are ``map`` results, not the dataset."""
    by_split: dict[str, list[Path]] = {}
    for f in sorted(path.glob("*.arrow")):
        if f.name.startswith("cache-"):
            continue
        m = re.fullmatch(r".+?-(\w+?)(?:-\d{5}-of-\d{5})?\.arrow", f.name)
        if m:
            by_split.setdefault(m.group(1), []).append(f)
    if not by_split:
        raise DatasetError(f"{source}: a datasets cache folder without split files (<name>-train.arrow)")
    chosen = _choose(sorted(by_split), split, source)
    return Located(source, tuple(by_split[chosen]), chosen)


def _data_folder(path: Path, source: str, split: str | None) -> Located:
    files = [f for f in _walk(path) if f.suffix.lower() in SUFFIXES and not f.name.startswith("cache-")
             and f.name not in ("dataset_info.json", "state.json", "dataset_dict.json", "config.json")]
    if not files:
        raise DatasetError(f"{source}: no data files in the folder (JSON lines, JSON, CSV, parquet, arrow)")
    if split is not None:
        named = [f for f in files if f.name == split or str(f.relative_to(path)) == split]
        if named:
            return Located(source, tuple(named), None)
    by_split: dict[str, list[Path]] = {}
    for f in files:
        by_split.setdefault(_split_of(f.relative_to(path)), []).append(f)
    if len(by_split) == 1 and split is None:
        ((only, group),) = by_split.items()
        return Located(source, tuple(group), None if only == "" else only)
    known = sorted(s for s in by_split if s)  # files named for no split are left out once some are
    chosen = _choose(known, SPLIT_WORDS.get(split, split) if split else None, source, files=files, root=path)
    return Located(source, tuple(by_split[chosen]), chosen)


def _walk(path: Path, depth: int = 0) -> list[Path]:
    out: list[Path] = []
    for entry in sorted(path.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and depth < MAX_DEPTH:
            out += _walk(entry, depth + 1)
        elif entry.is_file():
            out.append(entry)
    return out


def _split_of(relative: Path) -> str:
    """The split a file belongs to by its name (``train-00000-of-00002.parquet``, ``data/test.jsonl``), or ""."""
    m = _SPLIT_RE.search(str(relative).lower())
    return SPLIT_WORDS[m.group(1)] if m else ""


def _choose(splits: list[str], split: str | None, source: str, files: list[Path] | None = None,
            root: Path | None = None) -> str:
    if split is not None:
        if split in splits:
            return split
        raise DatasetError(f"{source}: no split {split!r}; it has {', '.join(splits) or 'none'} "
                           "(pass --dataset-split NAME)")
    if len(splits) == 1:
        return splits[0]
    if "train" in splits:
        return "train"
    extra = ""
    if files is not None and root is not None:
        extra = " or a file: " + ", ".join(str(f.relative_to(root)) for f in files[:4])
    raise DatasetError(f"{source}: several splits ({', '.join(splits)}): pass --dataset-split NAME{extra}")


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: cannot read it ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: not a JSON object")
    return data


def hf_cache_roots() -> tuple[Path, Path]:
    """(the ``datasets`` cache, the hub cache), as ``datasets`` and ``huggingface_hub`` find them."""
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    datasets_root = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    hub_root = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub")
    return datasets_root, hub_root.expanduser()


def _from_cache(hub_id: str, split: str | None) -> Located:
    """A hub dataset that ``load_dataset`` already prepared (the ``datasets`` cache) or that ``snapshot_download``
    fetched (the hub cache); the newest copy when there are several."""
    datasets_root, hub_root = hf_cache_roots()
    org, _, name = hub_id.rpartition("/")
    wanted = (f"{org}___{name}" if org else name).lower()
    if datasets_root.is_dir():
        for entry in datasets_root.iterdir():
            if entry.is_dir() and entry.name.lower() == wanted:
                builds = [p.parent for p in entry.glob("*/*/*/dataset_info.json")]
                if builds:
                    newest = max(builds, key=lambda p: p.stat().st_mtime)
                    inner = _builder_folder(newest, hub_id, split)
                    return Located(hub_id, inner.files, inner.split, f"the hub dataset {hub_id} from the local "
                                   f"datasets cache ({newest})")
    repo = hub_root / ("datasets--" + hub_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if snapshots.is_dir():
        ref = repo / "refs" / "main"
        snap = snapshots / ref.read_text().strip() if ref.is_file() else None
        if snap is None or not snap.is_dir():
            candidates = [p for p in snapshots.iterdir() if p.is_dir()]
            snap = max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None
        if snap is not None:
            inner = _data_folder(snap, hub_id, split)
            return Located(hub_id, inner.files, inner.split, f"the hub dataset {hub_id} from the local hub cache "
                           f"({snap})")
    raise DatasetError(f"{hub_id}: no such file or folder, and not in the local Hugging Face cache "
                       f"({datasets_root}, {hub_root}); vramscope never downloads: pass a local path, or load it "
                       "once with datasets.load_dataset")
