"""What people paste and what a plan tells them: hub ids, cached configs, GPU names, sizes, cards, advice."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vramscope.planner import hub_cache, plan, registry, shape_from_config
from vramscope.planner.errors import PlanInputError, UnknownModelError


def vramscope(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "vramscope", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("pasted", "planned_as"), [
    ("mistralai/Mistral-7B-Instruct-v0.2", "Mistral-7B-v0.2"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "Mistral-7B-v0.3"),
    ("meta-llama/Llama-3.2-1B-Instruct", "Llama-3.2-1B"),
    ("meta-llama/Llama-3.2-3B", "Llama-3.2-3B"),
    ("mistralai/Mistral-Nemo-Instruct-2407", "Mistral-Nemo-12B"),
    ("google/gemma-2-9b-it", "Gemma-2-9B"),
])
def test_variants_plan_as_their_base(pasted: str, planned_as: str) -> None:
    assert registry.resolve(pasted) == planned_as


def test_the_new_entries_have_their_published_sizes() -> None:
    # Parameter counts as the model cards give them (billions, rounded as published).
    for name, billions in (("Llama-3.2-1B", 1.24), ("Llama-3.2-3B", 3.21), ("Mistral-7B-v0.3", 7.25),
                           ("Mistral-Nemo-12B", 12.2)):
        shape = shape_from_config(registry.get_config(name))
        assert shape.total_params() / 1e9 == pytest.approx(billions, abs=0.06), name


def write_cache(root: Path, repo: str, config: dict[str, object], ref: bool = True) -> Path:
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if ref:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text("0123abcd")
    return snapshot / "config.json"


def test_a_model_in_the_local_cache_plans_offline(tmp_path: Path) -> None:
    config = registry.get_config("Llama-2-13B")
    write_cache(tmp_path / "hub", "acme/my-13b-finetune", config)
    out = vramscope("plan", "--model", "acme/my-13b-finetune", "--batch-size", "1", "--seq-len", "512", "--json",
                    env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = json.loads(vramscope("plan", "--model", "Llama-2-13B", "--batch-size", "1", "--seq-len", "512",
                                "--json").stdout)
    assert got["peak_allocated_bytes"] == want["peak_allocated_bytes"]
    # HF_HOME's hub folder, and a cache without refs (a snapshot downloaded by commit) are found too.
    write_cache(tmp_path / "home" / "hub", "acme/other", config, ref=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("HF_HUB_CACHE", raising=False)
        mp.setenv("HF_HOME", str(tmp_path / "home"))
        assert hub_cache.cached_config("acme/other")["hidden_size"] == config["hidden_size"]  # type: ignore[index]


def test_an_unknown_model_not_in_the_cache_is_one_line(tmp_path: Path) -> None:
    out = vramscope("plan", "--model", "acme/not-here", "--batch-size", "1", "--seq-len", "64",
                    env={"HF_HUB_CACHE": str(tmp_path)})
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "local Hugging Face cache" in out.stderr
    with pytest.raises(UnknownModelError):
        plan("acme/not-here", 1, 64)


def test_a_broken_cached_config_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_cache(tmp_path, "acme/broken", {"model_type": "llama"})
    path.write_text("{not json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(PlanInputError, match="not valid JSON"):
        hub_cache.cached_config("acme/broken")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A real HTTP server on the loopback standing in for the hub: it serves one config.json and logs paths."""
    seen: list[str] = []
    body = json.dumps(registry.get_config("Mistral-7B")).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            if self.path == "/acme/gated/resolve/main/config.json":
                self.send_response(401)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(hub_cache, "HUB_URL", f"http://127.0.0.1:{server.server_address[1]}")
    yield seen
    server.shutdown()


def test_download_fetches_config_json_alone(hub: list[str]) -> None:
    config = hub_cache.download_config("acme/mistral-ft")
    assert config["hidden_size"] == 4096 and config["_name_or_path"] == "acme/mistral-ft"
    assert hub == ["/acme/mistral-ft/resolve/main/config.json"]  # nothing but config.json
    with pytest.raises(PlanInputError, match="HF_TOKEN"):
        hub_cache.download_config("acme/gated")


def test_a_family_name_sold_in_two_sizes_says_which_it_planned() -> None:
    out = vramscope("plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512", "--gpu", "A100")
    assert out.returncode == 0, out.stderr
    assert "planned for A100-40GB" in out.stdout and "--gpu A100-80GB" in out.stdout
    exact = vramscope("plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512", "--gpu", "A100-80GB")
    assert "sold with more than one memory size" not in exact.stdout


def test_bf16_on_a_card_without_it_is_planned_in_fp16() -> None:
    t4 = plan("Llama-2-7B", 1, 512, gpu="T4")
    assert any("no bf16" in note for note in t4.notes) and "fp16 autocast" in t4.framework_title
    a10 = plan("Llama-2-7B", 1, 512, gpu="A10G")
    assert not any("no bf16" in note for note in a10.notes) and "bf16 autocast" in a10.framework_title


def test_a_bare_size_plans_a_representative_model_and_says_which() -> None:
    sized = plan("70B", 1, 512)
    named = plan("Llama-3.1-70B", 1, 512)
    assert sized.peak_allocated_bytes == named.peak_allocated_bytes
    assert sized.notes[0].startswith("--model 70B is a size, not a model: planned as Llama-3.1-70B")
    assert not any("is a size" in note for note in named.notes)
    with pytest.raises(UnknownModelError):
        plan("6B", 1, 512)  # no representative: the closest names, not a guess


def test_without_a_gpu_the_plan_names_the_cards_it_fits() -> None:
    small = plan("Llama-2-7B", 1, 512)
    assert any(n.startswith("fits at this batch on T4 (15.0 GiB) and every larger common card") for n in small.notes)
    big = plan("Llama-2-13B", 4, 2048)
    note = next(n for n in big.notes if n.startswith("fits at this batch on"))
    assert ", not on T4" in note and "H200" not in note.split(", not on")[1]
    assert not any(n.startswith("fits") for n in plan("Llama-2-7B", 1, 512, gpu="RTX-4090").notes)


def test_no_advice_saves_less_than_one_percent() -> None:
    from vramscope.planner import recommend

    for model, batch, seq in (("Llama-2-7B", 1, 512), ("Llama-3.1-8B", 4, 2048), ("Qwen2.5-0.5B", 2, 256)):
        step = plan(model, batch, seq).peak_allocated_bytes
        recs = recommend(model, batch, seq, capacity_bytes=8 * 2**30)
        assert recs, model
        assert all(r.saving_bytes >= 0.0099 * step for r in recs), [(r.name, r.saving_bytes) for r in recs]
