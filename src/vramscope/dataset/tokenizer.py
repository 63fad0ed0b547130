"""The run's tokenizer, loaded the fast way: ``tokenizers.Tokenizer.from_file(tokenizer.json)`` (Rust, no torch),
with transformers' ``AutoTokenizer`` only for a folder without a tokenizer.json. Its chat template (jinja, from
``tokenizer_config.json`` or ``chat_template.jinja``) is rendered the way ``apply_chat_template`` renders it: by
transformers' own renderer where transformers is installed, else by a jinja2 sandbox with the same settings.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from vramscope.dataset.files import hf_cache_roots
from vramscope.dataset.types import DatasetError

CHUNK = 8192  # texts per encode_batch call: bounds the encodings held at once
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def find_tokenizer(*candidates: str | None) -> Path | None:
    """The first candidate that is a tokenizer folder (or a tokenizer.json): a local path, or a hub model id whose
    snapshot is in the local hub cache. None when none is."""
    for name in candidates:
        if not name:
            continue
        path = Path(name).expanduser()
        if path.is_file() and path.name == "tokenizer.json":
            return path.parent
        if path.is_file():
            path = path.parent  # a config.json: its folder
        if path.is_dir() and _has_tokenizer(path):
            return path
        if not path.exists() and "/" in name:
            snapshot = _hub_snapshot(name)
            if snapshot is not None and _has_tokenizer(snapshot):
                return snapshot
    return None


def _has_tokenizer(path: Path) -> bool:
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    return any((path / f).is_file() for f in names)


def _hub_snapshot(model_id: str) -> Path | None:
    _, hub_root = hf_cache_roots()
    repo = hub_root / ("models--" + model_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = [p for p in (repo / "snapshots").glob("*") if p.is_dir()]
    return max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class RunTokenizer:
    """Token counts and chat templates with the run's tokenizer."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        config = _read_json(folder / "tokenizer_config.json")
        special = {**_read_json(folder / "special_tokens_map.json"), **config}
        self.special: dict[str, str] = {}
        for name in SPECIAL_NAMES:
            text = _token_text(special.get(name))
            if text is not None:
                self.special[name] = text
        self.chat_template = _chat_template(folder, config)
        self._fast: Any = None
        self._slow: Any = None
        if (folder / "tokenizer.json").is_file():
            try:
                from tokenizers import Tokenizer
            except ImportError:
                pass
            else:
                try:
                    fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
                except Exception as exc:
                    raise DatasetError(f"{folder / 'tokenizer.json'}: cannot load it ({str(exc)[:120]})") from None
                fast.no_truncation()  # a tokenizer.json may carry truncation or padding: the trainer's call has none
                fast.no_padding()
                self._fast = fast
        if self._fast is None:
            self._slow = _auto_tokenizer(folder)
            for name in SPECIAL_NAMES:
                text = getattr(self._slow, name, None)
                if isinstance(text, str) and name not in self.special:
                    self.special[name] = text
            if self.chat_template is None and isinstance(getattr(self._slow, "chat_template", None), str):
                self.chat_template = self._slow.chat_template
        if "eos_token" not in self.special:
            eos = self._eos_from_model_config()
            if eos is not None:
                self.special["eos_token"] = eos
        self.how = "tokenizers (tokenizer.json)" if self._fast is not None else "transformers AutoTokenizer"

    @property
    def eos_token(self) -> str | None:
        return self.special.get("eos_token")

    def _eos_from_model_config(self) -> str | None:
        ids = _read_json(self.folder / "generation_config.json").get("eos_token_id",
                                                                    _read_json(self.folder / "config.json").get(
                                                                        "eos_token_id"))
        first = ids[0] if isinstance(ids, list) and ids else ids
        if isinstance(first, int) and self._fast is not None:
            token = self._fast.id_to_token(first)
            return str(token) if token is not None else None
        return None

    def lengths(self, texts: Sequence[str], add_special_tokens: bool = True) -> np.ndarray:
        """Tokens per text, as ``tokenizer(text, add_special_tokens=...)`` gives them (no truncation)."""
        out = np.zeros(len(texts), dtype=np.int64)
        for start in range(0, len(texts), CHUNK):
            chunk = list(texts[start:start + CHUNK])
            if self._fast is not None:
                encode = getattr(self._fast, "encode_batch_fast", self._fast.encode_batch)  # no offsets: faster
                counts = [len(e) for e in encode(chunk, add_special_tokens=add_special_tokens)]
            else:
                counts = [len(ids) for ids in self._slow(chunk, add_special_tokens=add_special_tokens)["input_ids"]]
            out[start:start + len(chunk)] = counts
        return out

    def render(self, conversations: Sequence[list[dict[str, Any]]], add_generation_prompt: bool = False) -> list[str]:
        """Each conversation rendered by the chat template, as ``apply_chat_template(..., tokenize=False)``."""
        if self.chat_template is None:
            raise DatasetError(f"{self.folder}: the tokenizer has no chat template (tokenizer_config.json's "
                               "chat_template or chat_template.jinja), and the dataset is conversational")
        try:
            return _render(self.chat_template, conversations, add_generation_prompt, self.special)
        except DatasetError:
            raise
        except Exception as exc:  # the template's own raise_exception, or a message it cannot render
            raise DatasetError(f"{self.folder}: the chat template fails on the dataset ({exc.__class__.__name__}: "
                               f"{str(exc)[:120]})") from None


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str):
        return template
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    return None


def _auto_tokenizer(folder: Path) -> Any:
    """transformers' AutoTokenizer, local files only: for a folder without a tokenizer.json (a sentencepiece
    ``tokenizer.model``, a slow vocabulary)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DatasetError(f"{folder}: no tokenizer.json, and reading its tokenizer needs transformers: "
                           "pip install 'vramscope[hf]'") from None
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise DatasetError(f"{folder}: transformers cannot load its tokenizer ({exc.__class__.__name__}: "
                           f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None


def _render(template: str, conversations: Sequence[list[dict[str, Any]]], add_generation_prompt: bool,
            special: dict[str, str]) -> list[str]:
    try:
        module = importlib.import_module("transformers.utils.chat_template_utils")
    except ImportError:
        module = None
    render_jinja_template: Any = getattr(module, "render_jinja_template", None)
    if render_jinja_template is not None:
        try:
            rendered, _ = render_jinja_template(conversations=list(conversations), chat_template=template,
                                                add_generation_prompt=add_generation_prompt, **special)
            return [str(r) for r in rendered]
        except TypeError:  # another transformers' signature: render it ourselves, the same way
            pass
    compiled = _compiled(template)
    return [compiled.render(messages=c, add_generation_prompt=add_generation_prompt, **special)
            for c in conversations]


_COMPILED: dict[str, Any] = {}


def _compiled(template: str) -> Any:
    """The template compiled as transformers compiles it: a sandbox, trim_blocks and lstrip_blocks, and the globals
    chat templates call (raise_exception, strftime_now, tojson without HTML escaping)."""
    if template in _COMPILED:
        return _COMPILED[template]
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise DatasetError("rendering a chat template needs jinja2 (pip install jinja2) or transformers") from None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    _COMPILED[template] = env.from_string(template)
    return _COMPILED[template]
