"""The OOM post-mortem on the CPU: recognising every OOM form, and the report built from a snapshot.

A real snapshot can only be taken on a GPU. Until one recorded by ``bench/oom_example.py`` on the
H200 is committed under ``tests/data/oom/``, the report is tested on a small snapshot written to the
structure torch documents for ``torch.cuda.memory._snapshot()`` (segments -> blocks -> frames, and
``device_traces``); torch's own ``_memory_viz`` tools read it, which checks that structure. When the
recorded one is there, ``test_report_from_a_real_h200_snapshot`` runs on it too.
"""

from __future__ import annotations

import copy
import html
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from vramscope.oom import (
    ENV_MAX_ENTRIES,
    ENV_VAR,
    NO_STACK,
    OomEvent,
    OomRecorder,
    PostMortem,
    advise,
    build_report,
    classify_stack,
    is_oom,
    oom_kind,
    post_mortem,
    render_html,
    render_markdown,
    report_from_files,
    site_of,
    write_report,
)
from vramscope.recipe import QLoraSpec

MIB = 1024 * 1024
GIB = 1024**3
DATA = Path(__file__).parent / "data" / "oom"
SITE_PACKAGES = "/usr/lib/python3.12/site-packages"


# -- every OOM form ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."), "cuda_allocator"),
        (torch.cuda.OutOfMemoryError("CUDA out of memory."), "cuda_allocator"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "cublas"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul(...)`"), "cublas"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cudnn"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), "cudnn"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"), "cudnn"),
        (
            RuntimeError(
                "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                "non-contiguous input."
            ),
            "cudnn",
        ),
        (
            RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
            "cuda_runtime",
        ),
        (RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED"), "cusolver"),
    ],
)
def test_every_oom_form_is_recognised(exc: BaseException, kind: str) -> None:
    assert oom_kind(exc) == kind
    assert is_oom(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("the caption cache is out of memory slots"),  # the words, but not a GPU OOM
        RuntimeError("CUDA error: device-side assert triggered"),
        RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
        ValueError("CUDA out of memory"),  # right words, wrong type: not what torch raises
        MemoryError(),
        KeyboardInterrupt(),
    ],
)
def test_other_errors_are_not_ooms(exc: BaseException) -> None:
    assert oom_kind(exc) is None
    assert not is_oom(exc)


# -- a snapshot in torch's documented structure ---------------------------------------------------


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


TORCH_LINEAR = frame(f"{SITE_PACKAGES}/torch/nn/modules/linear.py", 125, "forward")
TORCH_CALL = frame(f"{SITE_PACKAGES}/torch/nn/modules/module.py", 1751, "_call_impl")
CHECKPOINT = frame(f"{SITE_PACKAGES}/torch/utils/checkpoint.py", 496, "checkpoint")
MLP = frame(f"{SITE_PACKAGES}/transformers/models/llama/modeling_llama.py", 152, "forward")
LAYER = frame(f"{SITE_PACKAGES}/transformers/models/llama/modeling_llama.py", 300, "forward")
TRAIN = frame("/home/me/train.py", 42, "train_step")
LOSS = [
    frame(f"{SITE_PACKAGES}/torch/nn/functional.py", 3494, "cross_entropy"),
    frame(f"{SITE_PACKAGES}/transformers/loss/loss_utils.py", 36, "fixed_cross_entropy"),
    frame(f"{SITE_PACKAGES}/transformers/loss/loss_utils.py", 64, "ForCausalLMLoss"),
    TRAIN,
]
OPTIM = [
    frame(f"{SITE_PACKAGES}/torch/optim/adamw.py", 180, "_init_group"),
    frame(f"{SITE_PACKAGES}/torch/optim/optimizer.py", 485, "wrapper"),
    frame("/home/me/train.py", 45, "train_step"),
]


def block(addr: int, size: int, state: str, frames: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"address": addr, "size": size, "state": state, "frames": frames or []}
    out["requested_size"] = size if state == "active_allocated" else 0
    return out


def segment(addr: int, blocks: list[dict[str, Any]], device: int = 0) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": device,
        "address": addr,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def make_snapshot(requested: int = 12 * MIB) -> dict[str, Any]:
    """GPU 0 at the moment of an OOM: two layers' activations from one site, the logits, optimizer
    state, weights loaded before recording, and free pieces too small for the request."""
    a, b, c = 0x7F0000000000, 0x7F0010000000, 0x7F0020000000
    act = [TORCH_LINEAR, TORCH_CALL, MLP, TORCH_CALL, LAYER, CHECKPOINT, TRAIN]
    segments = [
        segment(
            a,
            [
                block(a, 8 * MIB, "active_allocated", act),
                block(a + 8 * MIB, 4 * MIB, "inactive"),
                block(a + 12 * MIB, 8 * MIB, "active_allocated", act),
            ],
        ),
        segment(
            b,
            [
                block(b, 30 * MIB, "active_allocated", LOSS),
                block(b + 30 * MIB, 6 * MIB, "inactive"),
                block(b + 36 * MIB, 4 * MIB, "active_allocated"),
            ],
        ),
        segment(c, [block(c, 2 * MIB, "active_allocated", OPTIM)]),
        # A segment on another GPU must not count for GPU 0.
        segment(0x7E0000000000, [block(0x7E0000000000, 64 * MIB, "active_allocated", act)], device=1),
    ]
    trace = [
        {"action": "segment_alloc", "addr": a, "size": 20 * MIB, "stream": 0, "time_us": 1, "frames": act},
        {"action": "alloc", "addr": a, "size": 8 * MIB, "stream": 0, "time_us": 2, "frames": act},
        {"action": "alloc", "addr": b, "size": 30 * MIB, "stream": 0, "time_us": 3, "frames": LOSS},
        {"action": "oom", "size": requested, "device_free": 1 * MIB, "stream": 0, "time_us": 4, "frames": LOSS},
    ]
    return {"segments": segments, "device_traces": [trace, []]}


CONTEXT = {"step": 17, "phase": "backward", "tokens": 8192, "batch_shape": [4, 2048]}


def event(**changes: Any) -> OomEvent:
    values: dict[str, Any] = {"device": 0, "capacity_bytes": 80 * MIB, "time": 1_700_000_000.0, "context": CONTEXT}
    values.update(changes)
    return OomEvent(**values)


def test_the_test_snapshot_has_torchs_structure() -> None:
    # torch's own snapshot tools read it: the accounting checks in segsum() pass, trace() walks the history.
    from torch.cuda import _memory_viz

    one_device = make_snapshot()
    summary = _memory_viz.segsum(one_device)
    assert "total_reserved: 126.0MiB" in summary  # every segment, as segsum does not split devices
    assert "raise OutOfMemoryError # 12.0MiB requested, 1.0MiB free in CUDA" in _memory_viz.trace(one_device)
    assert "snapshot.pickle" in _memory_viz.trace_plot(copy.deepcopy(one_device))


def test_report_numbers() -> None:
    report = build_report(make_snapshot(), event())
    assert report.reserved_bytes == (20 + 40 + 2) * MIB  # GPU 0's segments only
    assert report.allocated_bytes == (8 + 8 + 30 + 4 + 2) * MIB
    assert report.free_in_segments_bytes == 10 * MIB
    assert report.largest_free_block_bytes == 6 * MIB
    assert report.fragmentation == pytest.approx(0.4)  # 1 - 6/10
    assert report.requested_bytes == 12 * MIB  # taken from the history's "oom" entry
    assert report.device_free_bytes == 1 * MIB
    assert report.outside_bytes == (80 - 1 - 62) * MIB
    # 12 MiB asked; the best place was 6 MiB inside a segment (CUDA had 1 MiB left): 6 MiB short.
    assert report.shortfall_bytes == 6 * MIB
    assert (report.step, report.phase, report.tokens, report.batch_shape) == (17, "backward", 8192, (4, 2048))
    assert report.segments == 3
    assert report.history_entries == 4
    assert report.checkpointing_seen


def test_sites_are_aggregated_by_stack_outside_torch() -> None:
    report = build_report(make_snapshot(), event())
    by_where = {s.where: s for s in report.top_sites}
    mlp = by_where["transformers/models/llama/modeling_llama.py:152 in forward"]
    assert (mlp.bytes, mlp.blocks, mlp.largest_bytes) == (16 * MIB, 2, 8 * MIB)
    assert mlp.via[0] == "transformers/models/llama/modeling_llama.py:300 in forward"
    assert mlp.kind == "checkpointed activations"
    loss = by_where["transformers/loss/loss_utils.py:36 in fixed_cross_entropy"]
    assert loss.kind == "loss/logits" and loss.bytes == 30 * MIB
    optim = by_where["train.py:45 in train_step"]  # torch/optim frames skipped for the site...
    assert optim.kind == "optimizer state"  # ...but still say what it is
    assert by_where[NO_STACK].kind == "no stack"
    assert report.unattributed_bytes == 4 * MIB
    assert [s.bytes for s in report.top_sites] == sorted((s.bytes for s in report.top_sites), reverse=True)


def test_site_of_and_classify_stack() -> None:
    assert site_of([]) == (NO_STACK, ())
    assert site_of([TORCH_LINEAR])[0] == "torch/nn/modules/linear.py:125 in forward"  # only torch: keep it
    assert classify_stack([]) == "no stack"
    assert classify_stack([frame("x/transformers/modeling_utils.py", 1, "from_pretrained")]) == "weights (loading)"
    assert classify_stack([MLP, TRAIN]) == "activations"


def test_the_report_holds_the_facts_and_the_post_mortem_adds_the_advice() -> None:
    report = build_report(make_snapshot(), event())
    assert "advice" not in report.to_dict() and "sites" not in report.to_dict()
    found = post_mortem(make_snapshot(), event())
    assert isinstance(found, PostMortem) and found.report == report
    assert found.advice == tuple(advise(report))  # no model told: vramscope's rules alone
    # oom-N.json keeps the order it always had: the advice after the history, before the snapshot's path.
    assert list(found.to_dict())[-5:] == ["history_entries", "advice", "advice_source", "snapshot_file", "breakdown"]


def test_each_oom_rule_is_one_function() -> None:
    from vramscope.advice.oom import RULES, facts_of

    facts = facts_of(build_report(make_snapshot(requested=8 * MIB), event()))
    said = {a.key for rule in RULES for a in rule(facts)}
    assert said == {a.key for a in advise(facts.report)} and "expandable_segments" in said
    assert len(RULES) == len({rule.__name__ for rule in RULES})


def test_fragmentation_advice_when_free_pieces_would_have_held_the_request() -> None:
    # 10 MiB free in pieces of 4 and 6: an 8 MiB request fails only because of the split.
    report = post_mortem(make_snapshot(requested=8 * MIB), event())
    keys = [a.key for a in report.advice]
    assert "expandable_segments" in keys
    frag = next(a for a in report.advice if a.key == "expandable_segments")
    assert frag.saves_bytes == 10 * MIB
    assert "expandable_segments:True" in frag.detail


def test_own_advice_is_ranked_and_sized_from_the_numbers() -> None:
    report = post_mortem(make_snapshot(), event())
    assert "vramscope's rules" in report.advice_source
    assert "not told the model" in report.advice_source
    micro = next(a for a in report.advice if a.key == "micro_batch")
    # activations with a stack (16 + 30 MiB) plus the 12 MiB request over a batch of 4
    assert "from 4 to" in micro.title
    assert micro.saves_bytes is not None and micro.saves_bytes > 0
    assert all(a.source == "snapshot" for a in report.advice)
    # what alone would have avoided the OOM comes first
    flags = [a.sufficient for a in report.advice]
    assert flags == sorted(flags, key=lambda f: 0 if f else 1)
    assert "gradient_checkpointing" not in {a.key for a in report.advice}  # checkpoint frames were seen


def test_planner_recommendations_fed_with_measured_numbers() -> None:
    snap = make_snapshot(requested=2 * GIB)
    report = post_mortem(
        snap, event(capacity_bytes=24 * GIB, device_free_bytes=0), model="Llama-2-7B", spec=QLoraSpec().to_dict()
    )
    assert "planner" in report.advice_source
    planner = [a for a in report.advice if a.source == "planner"]
    assert planner, report.advice
    assert {a.key for a in planner} >= {"micro_batch", "seq_len"}
    assert all("batch 4 x 2048" in a.detail for a in planner)
    # the snapshot's measured evidence (memory outside the allocator) is kept beside them
    assert "outside_memory" in {a.key for a in report.advice}
    # the model can also come from the context
    via_context = post_mortem(snap, event(capacity_bytes=24 * GIB, context={**CONTEXT, "model": "Llama-2-7B"}))
    assert "planner" in via_context.advice_source
    unknown = post_mortem(snap, event(context={**CONTEXT, "model": "no-such-model"}))
    assert "could not use this model" in unknown.advice_source


def test_the_post_mortem_says_what_the_model_and_optimizer_held() -> None:
    from vramscope.types import MemoryBreakdown

    held = MemoryBreakdown(device="cuda:0", weights={"4-bit (uint8)": 3 * GIB, "bfloat16": GIB // 2},
                           quantization_constants=GIB // 8, lora_weights=GIB // 4, gradients=GIB // 4,
                           optimizer_states=GIB // 2, activations_at_peak=9 * GIB, peak_allocated_bytes=14 * GIB)
    report = post_mortem(make_snapshot(), event(context={**CONTEXT, "breakdown": held.to_dict()}))
    md = render_markdown(report)
    assert "## What held memory" in md
    assert "| weights (4-bit (uint8)) | 3.0 GiB |" in md
    assert "| activations and temporaries at the peak | 9.0 GiB |" in md
    assert "What held memory" in render_html(report)
    # a context without one (or with a damaged one) gives the report without that section
    assert "What held memory" not in render_markdown(post_mortem(make_snapshot(), event(context=CONTEXT)))
    damaged = post_mortem(make_snapshot(), event(context={**CONTEXT, "breakdown": {"weights": "?"}}))
    assert "What held memory" not in render_markdown(damaged)


def test_markdown_and_html_are_escaped() -> None:
    snap = make_snapshot()
    evil = frame("/tmp/x|<img src=x onerror=alert(1)>.py", 1, "<script>alert(1)</script>")
    snap["segments"][0]["blocks"][0]["frames"] = [evil]
    report = post_mortem(snap, event(message="CUDA out of memory. Tried to allocate <12 MiB> & more"))
    page = render_html(report)
    assert "<script>" not in page and "<img" not in page
    assert html.escape("x|<img src=x onerror=alert(1)>.py:1 in <script>alert(1)</script>") in page
    assert "&lt;12 MiB&gt; &amp; more" in page
    md = render_markdown(report)
    assert "x\\|&lt;img" in md  # a pipe in a cell does not break the table, markup is not markup
    assert "<img" not in md
    assert "| Requested | 12 MiB |" in md
    assert "| Batch shape | 4 x 2048 |" in md
    assert "## What to change, ranked" in md


def test_files_round_trip(tmp_path: Path) -> None:
    snap = make_snapshot()
    snap_path = tmp_path / "oom-1-snapshot.pickle"
    snap_path.write_bytes(pickle.dumps(snap))
    ev = event()
    (tmp_path / "oom-1.event.json").write_text(json.dumps({**ev.__dict__, "snapshot_file": str(snap_path)}))
    found = report_from_files(snap_path, tmp_path / "oom-1.event.json")
    assert found.report.requested_bytes == 12 * MIB and found.report.step == 17
    paths = write_report(found, tmp_path, "oom-1")
    written = json.loads(paths["json"].read_text())
    assert written["allocated_bytes"] == found.report.allocated_bytes
    assert [a["key"] for a in written["advice"]] == [a.key for a in found.advice]
    assert "sites" not in written  # every site is for the advice; the file keeps the top ones
    assert paths["html"].read_text().startswith("<!doctype html>")
    assert str(snap_path) in paths["md"].read_text()


def test_the_event_file_is_the_events_own_json(tmp_path: Path) -> None:
    ev = event()
    path = tmp_path / "oom-1.event.json"
    path.write_text(json.dumps({**ev.to_json("/runs/oom-1-snapshot.pickle"), "written_by": "a later vramscope"}))
    assert OomEvent.from_json(json.loads(path.read_text())) == (ev, "/runs/oom-1-snapshot.pickle")
    assert OomEvent.from_json({"device": 1}) == (OomEvent(device=1), None)
    with pytest.raises(ValueError, match="JSON object"):
        OomEvent.from_json([1, 2])


def test_the_message_that_comes_after_the_oom_is_written_into_its_files(tmp_path: Path) -> None:
    # torch's observer writes the post-mortem at the OOM; the exception's message arrives after, by record_exception
    # (CUDA only), which rewrites the event file through OomEvent and the post-mortem from it.
    snap_path = tmp_path / "oom-1-snapshot.pickle"
    snap_path.write_bytes(pickle.dumps(make_snapshot()))
    event_path = tmp_path / "oom-1.event.json"
    event_path.write_text(json.dumps(event(message=None).to_json(str(snap_path))))
    recorder = OomRecorder(tmp_path)
    recorder.reports.append(write_report(report_from_files(snap_path, event_path), tmp_path, "oom-1")["md"])
    message = "CUDA out of memory. Tried to allocate 12.00 MiB. GPU 0 has a total capacity of 23.55 GiB"
    assert recorder._annotate_last(message) == tmp_path / "oom-1.md"
    written, snapshot = OomEvent.from_json(json.loads(event_path.read_text()))
    assert written == event(message=message) and snapshot == str(snap_path)
    assert message in (tmp_path / "oom-1.md").read_text()


def test_recorder_from_env_and_arguments(tmp_path: Path) -> None:
    assert OomRecorder.from_env(environ={}) is None
    rec = OomRecorder.from_env(context=lambda: CONTEXT, environ={ENV_VAR: str(tmp_path), ENV_MAX_ENTRIES: "500"})
    assert rec is not None and rec.out_dir == tmp_path and rec.max_entries == 500 and not rec.active
    with pytest.raises(ValueError, match="max_entries"):
        OomRecorder(tmp_path, max_entries=0)
    with pytest.raises(ValueError, match="stacks"):
        OomRecorder(tmp_path, stacks="cpp")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_recorder_needs_cuda(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        OomRecorder(tmp_path).start()


@pytest.mark.skipif(not any(DATA.glob("*-snapshot.pickle")), reason="no snapshot recorded on the H200 committed yet")
def test_report_from_a_real_h200_snapshot() -> None:
    snap_path = sorted(DATA.glob("*-snapshot.pickle"))[0]
    event_path = snap_path.with_name(snap_path.name.replace("-snapshot.pickle", ".event.json"))
    found = report_from_files(snap_path, event_path if event_path.exists() else None)
    report = found.report
    assert report.reserved_bytes > 0 and report.allocated_bytes > 0
    assert report.allocated_bytes <= report.reserved_bytes
    assert report.requested_bytes is not None and report.requested_bytes > 0
    assert report.top_sites and report.top_sites[0].bytes > 0
    assert found.advice
    assert "<script" not in render_html(found)


def test_blocks_awaiting_a_free_on_another_stream_count_as_held() -> None:
    snap = make_snapshot()
    snap["segments"][2]["blocks"][0]["state"] = "active_awaiting_free"
    report = build_report(snap, event())
    assert report.allocated_bytes == (8 + 8 + 30 + 4 + 2) * MIB
    assert report.free_in_segments_bytes == 10 * MIB
