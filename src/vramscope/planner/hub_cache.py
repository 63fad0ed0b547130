"""A Hugging Face model's ``config.json`` from the local hub cache, so that any model already downloaded plans offline.

The cache's layout is huggingface_hub's documented one (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``): ``models--ORG--NAME/refs/main`` names a snapshot, whose folder holds the files.
Reading it needs no library and no network. Fetching ``config.json`` alone (never the weights) happens only when
the caller allows it, as ``plan --download-config`` does.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from vramscope.planner.errors import PlanInputError

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# config.json is a few KB; a cap keeps a wrong file (or a hostile server) from filling memory.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
HUB_URL = "https://huggingface.co"


def cache_dir() -> Path:
    """Where huggingface_hub keeps downloaded repositories on this machine."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def looks_like_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name.strip()))


def cached_config_path(repo_id: str, revision: str = "main") -> Path | None:
    """The cached ``config.json`` of ``repo_id`` at ``revision`` (a branch or a commit), or None."""
    if not looks_like_hub_id(repo_id):
        return None
    repo = cache_dir() / f"models--{repo_id.strip().replace('/', '--')}"
    ref = repo / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    except OSError:
        return None
    candidates = [repo / "snapshots" / commit / "config.json"]
    if not ref.is_file() and (repo / "snapshots").is_dir():  # no ref: the newest snapshot that has one
        snapshots = sorted((repo / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        candidates += [s / "config.json" for s in snapshots]
    return next((c for c in candidates if c.is_file()), None)


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise PlanInputError(f"{where} is not valid JSON ({exc}); delete it and download it again") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise PlanInputError(f"{where} is not a model's config.json (no model_type)")
    return config


def cached_config(repo_id: str) -> dict[str, Any] | None:
    """The config.json fields of ``repo_id`` when the local hub cache has them, else None."""
    path = cached_config_path(repo_id)
    if path is None:
        return None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise PlanInputError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes: not a config.json")
    config = _parse(path.read_text(encoding="utf-8"), str(path))
    config.setdefault("_name_or_path", repo_id.strip())
    return config


def download_config(repo_id: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """Fetch only ``config.json`` of ``repo_id`` from the hub (``HF_TOKEN`` for gated models). Never the weights.

    Raises:
        PlanInputError: the id is not a hub id, the hub refused (gated, missing) or could not be reached.
    """
    if not looks_like_hub_id(repo_id):
        raise PlanInputError(f"{repo_id!r} is not a hub id like ORG/NAME")
    url = f"{HUB_URL}/{repo_id.strip()}/resolve/main/config.json"
    request = urllib.request.Request(url, headers={"User-Agent": "vramscope"})
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(MAX_CONFIG_BYTES + 1)
    except urllib.error.HTTPError as exc:
        hint = "a gated model needs HF_TOKEN" if exc.code in (401, 403) else "check the id"
        raise PlanInputError(f"the hub answered {exc.code} for {repo_id}'s config.json; {hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PlanInputError(f"cannot reach the hub for {repo_id}'s config.json ({exc}); "
                             "pass --config PATH/config.json instead") from None
    if len(body) > MAX_CONFIG_BYTES:
        raise PlanInputError(f"{repo_id}'s config.json is larger than {MAX_CONFIG_BYTES} bytes")
    config = _parse(body.decode("utf-8", errors="replace"), f"{repo_id}'s config.json")
    config.setdefault("_name_or_path", repo_id.strip())
    return config
