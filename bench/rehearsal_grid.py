"""The multi-GPU planner against rehearsed ranks (issue 27): per-rank memory of FSDP-QLoRA and DDP at world sizes
2-16, with and without CPU offload, measured on one GPU as rank 0 of N on torch's fake process group.

Every case is a fresh process: ``VRAMSCOPE_REHEARSAL=N`` and ``vramscope.tune.rehearsal_pg.install`` (what the
start-up hook calls in a rehearsal child) make its ``init_process_group("nccl")`` rank 0 of N on the fake group;
the model is loaded as FSDP-QLoRA loads it (NF4, double quantization, ``bnb_4bit_quant_storage=bfloat16``,
``prepare_model_for_kbit_training`` with non-reentrant gradient checkpointing, LoRA r=64 on every linear layer),
wrapped (FSDP2 ``fully_shard`` per decoder layer and at the root, ``CPUOffloadPolicy`` for offload; or
``DistributedDataParallel``), stepped three times with torch's AdamW, and measured: the allocator's peak, NVML's
process memory, and the host RSS (what CPU offload puts there: the rise of RSS over the steps above RSS just
before the wrap, with the model loaded: the pinned shards and the CPU optimizer states). The same inputs go to the
planner's distributed model (``planner/distributed.py``); every case becomes one object of
``<out>/rehearsal_grid.json``: strategy, world_size, how (``fake_pg``), rank, arch, batch, seq, offload,
measured_/planned_peak_allocated_bytes, measured_/planned_host_bytes, and the rest of what was seen.

The 7B and 13B shapes load from a random bf16 checkpoint (``write_random_checkpoint``, in /dev/shm). A 70B bf16
checkpoint (138 GB) fits neither the device's 64 GB disk nor its memory beside the runs, so the 70B shape is
built without one: on the meta device, then every linear layer of every decoder layer materialised as random
bf16 on the GPU and quantized to NF4 at once (``bnb.nn.Params4bit``), one at a time, the peak one layer's bf16
weights above the 4-bit model (``--arch 70b``; the same modules from_pretrained makes).

    python bench/rehearsal_grid.py --dry-run                # every case's command and plan, no torch needed
    python bench/rehearsal_grid.py --tiny --out /tmp/grid   # CPU: a tiny 4-bit Llama through the same code
    python bench/rehearsal_grid.py --out $OUT/multigpu      # the H200 (bench/h200/rehearsal_grid.sh)
    python bench/rehearsal_grid.py --precision autocast --out $OUT/multigpu   # bf16 autocast: ..._autocast.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ARCHS = {"7b": "Llama-2-7B", "13b": "Llama-2-13B", "70b": "Llama-2-70B"}
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512}
BATCH, SEQ = 1, 2048
WORLDS = (2, 4, 8, 16)
# GPU memory a case may take at once (the whole 4-bit model before it is sharded, LoRA, one step), for the
# scheduler that runs several cases side by side on the one GPU.
GPU_NEED = {"tiny": 0, "7b": 8 << 30, "13b": 12 << 30, "70b": 40 << 30}
BUDGET_S = 380
CASE_TIMEOUT_S = 240
# What the child's loop is, for the planner (see plan()): without autocast, a loop keeping only the loss; under
# bf16 autocast (``--precision autocast``), the HF Trainer's dtypes (its compute_loss keeps only the loss too).
PLANNED_FRAMEWORK = {"fp32": "loop-loss", "autocast": "hf"}


@dataclass(frozen=True)
class Case:
    arch: str  # a key of ARCHS, or "tiny"
    strategy: str  # "fsdp" (FSDP2 fully_shard) or "ddp"
    world_size: int
    offload: str  # "none" or "params"
    batch: int
    seq: int
    build: str  # "checkpoint" (from_pretrained of a random checkpoint) or "meta" (per-layer quantization)
    precision: str = "fp32"  # "fp32" (no autocast: kbit preparation's fp32 stream) or "autocast" (bf16 autocast)

    @property
    def name(self) -> str:
        return (f"{self.arch}-{self.strategy}{self.world_size}" + ("-offload" if self.offload != "none" else "")
                + ("-autocast" if self.precision == "autocast" else ""))


def cases(archs: list[str], worlds: tuple[int, ...], tiny: bool, precision: str = "fp32") -> list[Case]:
    """FSDP at every world size with and without parameter offload, DDP at the smallest; in the order they run,
    world size by world size, so that the budget's end cuts the largest world sizes, not a whole shape. 70B goes to
    8 ranks at most, and has no DDP: a whole 70B replica per rank is no answer on any GPU."""
    out: list[Case] = []
    batch, seq = (2, 32) if tiny else (BATCH, SEQ)
    for w in worlds:
        for arch in (["tiny"] if tiny else archs):
            if arch == "70b" and w > 8:
                continue
            build = "meta" if arch == "70b" else "checkpoint"
            for offload in ("none",) if tiny else ("none", "params"):  # CPU offload needs a GPU to offload from
                out.append(Case(arch, "fsdp", w, offload, batch, seq, build, precision))
            if arch != "70b" and w == worlds[0]:
                out.append(Case(arch, "ddp", w, "none", batch, seq, build, precision))
    if tiny:  # the meta build too, on the CPU
        out.append(Case("tiny", "fsdp", 4, "none", batch, seq, "meta", precision))
    return out


def config_of(arch: str) -> dict[str, Any]:
    if arch == "tiny":
        return dict(TINY)
    from vramscope.planner.registry import get_config

    return dict(get_config(ARCHS[arch]))


def plan(case: Case, config: dict[str, Any]) -> dict[str, Any]:
    """The planner's rank for the case: the distributed model over the single-GPU one."""
    from vramscope.planner.distributed import Parallelism, estimate_distributed
    from vramscope.planner.shapes import shape_from_config
    from vramscope.recipe import QLoraSpec

    # The child's loop (below) has no autocast and keeps only the loss: the planner's ``loop-loss`` framework
    # (prepare_model_for_kbit_training's fp32 stream, fp32 LoRA, fp32 q/k/v into SDPA). Planning it as the HF
    # Trainer's bf16-autocast run (``hf``, the grid's first plan) put half LoRA and SDPA inputs where the run had
    # fp32 ones: 2-7% high on 7B/13B, and 1.8 GiB low on the 70B shape, whose grouped-query fp32 attention takes
    # SDPA's math kernel (B x 64 heads x S x S fp32 scores). bitsandbytes' paged optimizers do not take FSDP2's
    # DTensors: torch's AdamW.
    spec = QLoraSpec(optim="adamw_torch", framework=PLANNED_FRAMEWORK[case.precision])
    par = Parallelism(world_size=case.world_size, strategy=case.strategy, offload=case.offload,
                      fsdp_version=2)  # the grid wraps with FSDP2 fully_shard
    dist = estimate_distributed(shape_from_config(config), spec, case.batch, case.seq, par)
    w = dist.worst
    return {"planned_framework": spec.framework, "planned_peak_allocated_bytes": w.peak_allocated_bytes,
            "planned_peak_reserved_bytes": w.peak_reserved_bytes, "planned_process_bytes": w.process_bytes,
            "planned_host_bytes": w.host_bytes,
            "planned_nccl_bytes": w.parts.get("nccl_buffers", 0), "planned_peak_phase": w.peak_phase}


# ---------------------------------------------------------------------------------------------- child
def _quant_config() -> Any:
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)


def _build_on_meta(config: dict[str, Any], device: Any) -> Any:
    """The 4-bit model without a checkpoint: built on meta, each decoder linear quantized as it is materialised."""
    import bitsandbytes as bnb
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    with init_empty_weights():  # parameters on meta; buffers (rotary inv_freq) real
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    gen = torch.Generator(device=device).manual_seed(0)
    for layer in model.model.layers:
        for name, child in list(layer.named_modules()):
            if not isinstance(child, torch.nn.Linear):
                continue
            parent = layer.get_submodule(name.rsplit(".", 1)[0]) if "." in name else layer
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                                  quant_storage=torch.bfloat16, device="meta")
            w = torch.randn(child.out_features, child.in_features, dtype=torch.bfloat16, device=device,
                            generator=gen) * 0.02
            # module=q: the quantization state is kept on the module too, where bitsandbytes finds it again
            # after FSDP has replaced the parameter with its shard.
            q.weight = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=True, quant_type="nf4",
                                         quant_storage=torch.bfloat16, module=q).to(device)
            del w
            if child.bias is not None:
                q.bias = torch.nn.Parameter(torch.zeros(child.out_features, dtype=torch.bfloat16, device=device))
            setattr(parent, name.rsplit(".", 1)[-1], q)
    for module in model.modules():  # the rest (embeddings, norms, lm_head): random bf16 on the device
        for pname, p in list(module.named_parameters(recurse=False)):
            if p.device.type == "meta":
                module._parameters[pname] = torch.nn.Parameter(
                    torch.randn(p.shape, dtype=torch.bfloat16, device=device, generator=gen) * 0.02,
                    requires_grad=p.requires_grad)
    model.to(device)  # the buffers
    model.config.quantization_config = _quant_config()
    for attr in ("is_loaded_in_4bit", "is_quantized"):
        try:
            setattr(model, attr, True)  # what peft reads to treat the base as 4-bit (prepare, Linear4bit LoRA)
        except AttributeError:
            pass
    return model


def _load(case: Case, ckpt: str | None, config: dict[str, Any], cuda: bool) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if case.build == "meta":
        model = _build_on_meta(config, device)
    else:
        model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="sdpa", dtype=torch.bfloat16,
                                                     quantization_config=_quant_config(),
                                                     device_map={"": 0 if cuda else "cpu"})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    lora = LoraConfig(r=64, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    return model


def _wrap(case: Case, model: Any, cuda: bool) -> Any:
    if case.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[0] if cuda else None, static_graph=True)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh("cuda" if cuda else "cpu", (case.world_size,))
    policy = CPUOffloadPolicy() if case.offload == "params" else OffloadPolicy()
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    return model


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _pinned_host_bytes() -> int | None:
    """Bytes of pinned blocks torch's host caching allocator holds (None where this torch has no such stats)."""
    import torch

    try:
        stats = torch.cuda.host_memory_stats()
    except (AttributeError, RuntimeError):
        return None
    value = stats.get("allocated_bytes.current", stats.get("reserved_bytes.current"))
    return int(value) if value is not None else None


def _cpu_state_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer's states that live on the CPU (the offload's AdamW moments), scalar steps aside."""
    total = 0
    for state in optimizer.state.values():
        for t in state.values():
            local = t.to_local() if hasattr(t, "to_local") else t
            if getattr(local, "device", None) is not None and local.device.type == "cpu" and local.dim() > 0:
                total += local.numel() * local.element_size()
    return total


def child(case: Case, ckpt: str | None, tiny: bool) -> int:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(case.world_size),
                      LOCAL_WORLD_SIZE=str(case.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                      VRAMSCOPE_REHEARSAL=str(case.world_size))
    from vramscope.tune.rehearsal_pg import install

    install()  # what the start-up hook does in a rehearsal child
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and not tiny
    out: dict[str, Any] = {**asdict(case), "status": "error"}
    sampler = None
    started = time.perf_counter()
    try:
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if cuda else "gloo")
        out["backend"] = dist.get_backend()
        out["rss_start_bytes"] = _rss()
        model = _load(case, ckpt, config_of(case.arch), cuda)
        out["load_seconds"] = round(time.perf_counter() - started, 1)
        full = sum(p.numel() for p in model.parameters())
        import gc

        gc.collect()
        if cuda:
            torch.cuda.synchronize()
        out["rss_before_wrap_bytes"] = _rss()  # CUDA's libraries and context, the loaded model: not the offload
        wrapped = _wrap(case, model, cuda)
        params = list(wrapped.parameters())
        out["parameters"] = full
        out["parameters_held"] = sum(int(p.to_local().numel()) if hasattr(p, "to_local") else int(p.numel())
                                     for p in params)
        optimizer = torch.optim.AdamW([p for p in params if p.requires_grad], lr=2e-4)
        gc.collect()
        out["rss_wrapped_bytes"] = _rss()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the unsharded model, freed by the wrap, leaves the reserve
            out["wrapped_allocated_bytes"] = torch.cuda.memory_allocated()
            from vramscope.backends.host import HostBackend
            from vramscope.backends.nvml import NvmlBackend
            from vramscope.sampling.sampler import Collector, Sampler

            nvml = NvmlBackend()
            if nvml.is_available():
                sampler = Sampler(Collector(nvml=nvml, host=HostBackend()), interval=0.05, history=4000).start()
            torch.cuda.reset_peak_memory_stats()
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        vocab = int(config_of(case.arch)["vocab_size"])
        gen = torch.Generator().manual_seed(0)
        rss_peak = 0
        rss_steps: list[int] = []
        process_peak = 0
        for _ in range(3):
            ids = torch.randint(0, vocab, (case.batch, case.seq), generator=gen).to(device)
            # bf16 autocast around the forward alone, as accelerate's mixed precision runs it; or none
            with (torch.autocast(device.type, dtype=torch.bfloat16) if case.precision == "autocast"
                  else contextlib.nullcontext()):
                loss = wrapped(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, ids
            if cuda:
                torch.cuda.synchronize()
            rss_peak = max(rss_peak, _rss())
            rss_steps.append(_rss())
            if sampler is not None:
                process_peak = max(process_peak, sampler.sample_now().process_bytes(0) or 0)
        if cuda:
            out["measured_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            out["measured_peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        if sampler is not None:
            for sample in list(sampler.history):
                process_peak = max(process_peak, sample.process_bytes(0) or 0)
            out["measured_process_bytes"] = process_peak or None
        out["rss_peak_bytes"] = rss_peak
        # RSS grows by about 0.56 GiB over the steps in every case, offload or not (CUDA's lazily loaded
        # kernel modules, cuBLAS and autograd's threads): the offload's own host memory is counted directly too,
        # the pinned host allocator's blocks (shards and gradients, rounded to powers of two) and the optimizer's
        # CPU states (pageable).
        out["rss_steps_bytes"] = rss_steps
        out["host_pinned_bytes"] = _pinned_host_bytes() if cuda else None
        out["host_optimizer_cpu_bytes"] = _cpu_state_bytes(optimizer)
        # What the offload keeps on the host: the rise of RSS from the loaded model, just before the wrap, to the
        # steps' worst (the pinned shards the wrap moves there, their gradients and the AdamW states on the CPU).
        # Measured without offload too: there it is the noise of the reading (the plan says 0).
        out["measured_host_bytes"] = max(0, rss_peak - out["rss_before_wrap_bytes"])
        out["status"] = "ok"
    except Exception as exc:  # a case that fails is a result too
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        if cuda and isinstance(exc, torch.OutOfMemoryError):
            out["status"] = "oom"
    finally:
        if sampler is not None:
            sampler.close()
    out["seconds"] = round(time.perf_counter() - started, 1)
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no process-group teardown: there is no one to say goodbye to


# --------------------------------------------------------------------------------------------- parent
def child_command(case: Case, ckpt: str | None, tiny: bool) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(asdict(case))]
    if ckpt:
        cmd += ["--ckpt", ckpt]
    return cmd + (["--tiny"] if tiny else [])


def _checkpoint(arch: str, root: Path, cuda: bool) -> str:
    from vramscope.tune.qlora import write_random_checkpoint

    return str(write_random_checkpoint(config_of(arch), root / arch, device="cuda" if cuda else None))


def _scratch(need_bytes: int) -> Path:
    for folder in ("/dev/shm", tempfile.gettempdir()):
        if os.path.isdir(folder) and shutil.disk_usage(folder).free > need_bytes:
            return Path(tempfile.mkdtemp(prefix="vs-grid-", dir=folder))
    raise SystemExit(f"no scratch folder has {need_bytes >> 30} GiB free for the random checkpoints")


def row(case: Case, result: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
    """One object of the results file: the issue's fields first, then everything else seen."""
    keys = ("status", "error", "measured_peak_reserved_bytes", "measured_process_bytes", "parameters",
            "parameters_held", "wrapped_allocated_bytes", "rss_start_bytes", "rss_before_wrap_bytes",
            "rss_wrapped_bytes", "rss_peak_bytes", "rss_steps_bytes", "host_pinned_bytes",
            "host_optimizer_cpu_bytes",
            "backend", "load_seconds", "seconds")
    out = {"strategy": case.strategy, "world_size": case.world_size, "how": "fake_pg", "rank": 0,
           "arch": ARCHS.get(case.arch, case.arch), "batch": case.batch, "seq": case.seq, "offload": case.offload,
           "measured_peak_allocated_bytes": result.get("measured_peak_allocated_bytes"),
           "planned_peak_allocated_bytes": planned["planned_peak_allocated_bytes"],
           "measured_host_bytes": result.get("measured_host_bytes"),
           "planned_host_bytes": planned["planned_host_bytes"],
           "build": case.build, "precision": case.precision,
           "fsdp": "FSDP2 fully_shard" if case.strategy == "fsdp" else None}
    out.update({k: result.get(k) for k in keys})
    out.update({k: v for k, v in planned.items() if k not in out})
    m, p = out["measured_peak_allocated_bytes"], out["planned_peak_allocated_bytes"]
    out["allocated_error"] = round((p - m) / m, 4) if isinstance(m, int) and m else None
    return out


def grid_file_name(precision: str) -> str:
    """rehearsal_grid.json for the loop without autocast, rehearsal_grid_autocast.json for the other."""
    return "rehearsal_grid.json" if precision == "fp32" else f"rehearsal_grid_{precision}.json"


def run_grid(args: argparse.Namespace) -> int:
    start = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = cases(args.arch, tuple(args.worlds), args.tiny, args.precision)
    if args.only:
        grid = [c for c in grid if re.search(args.only, c.name)]
    configs = {c.arch: config_of(c.arch) for c in grid}
    plans = {c: plan(c, configs[c.arch]) for c in grid}
    if args.dry_run:
        for c in grid:
            ckpt = None if c.build == "meta" else f"<scratch>/{c.arch}"
            p = plans[c]
            print(f"{c.name:27} plan alloc {p['planned_peak_allocated_bytes'] / 2**30:6.2f} GiB host "
                  f"{p['planned_host_bytes'] / 2**30:6.2f} GiB  $ {' '.join(child_command(c, ckpt, args.tiny))}")
        print(f"{len(grid)} cases")
        return 0
    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    need = sum(_bf16_bytes(configs[a]) for a in {c.arch for c in grid if c.build == "checkpoint"})
    root = _scratch(need + (4 << 30))
    ckpts: dict[str, str] = {}
    for arch in dict.fromkeys(c.arch for c in grid if c.build == "checkpoint"):
        t0 = time.time()
        ckpts[arch] = _checkpoint(arch, root, cuda)
        print(f"checkpoint {arch}: {time.time() - t0:.0f} s", flush=True)
    if cuda:
        torch.cuda.empty_cache()
    budget = args.gpu_budget << 30
    pending = list(grid)
    running: list[tuple[Case, subprocess.Popen[str], float]] = []
    results: dict[Case, dict[str, Any]] = {}
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    while pending or running:
        used = sum(GPU_NEED[c.arch] for c, _, _ in running)
        left = args.budget - (time.time() - start)
        for c in list(pending):
            if len(running) >= args.parallel or (running and used + GPU_NEED[c.arch] > budget):
                continue
            if left < (90 if c.arch == "70b" else 45):
                results[c] = {"status": "skipped", "error": f"{left:.0f} s left of the {args.budget} s budget"}
                pending.remove(c)
                continue
            cmd = child_command(c, ckpts.get(c.arch), args.tiny)
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            running.append((c, proc, time.time()))
            used += GPU_NEED[c.arch]
            pending.remove(c)
        time.sleep(0.5)
        for item in list(running):
            c, proc, t0 = item
            timed_out = time.time() - t0 > min(CASE_TIMEOUT_S, args.budget + 30 - (t0 - start))
            if proc.poll() is None and not timed_out:
                continue
            if proc.poll() is None:
                proc.kill()
            text = proc.communicate()[0] or ""
            lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
            if lines:
                results[c] = json.loads(lines[-1][len("RESULT "):])
            else:
                tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
                results[c] = {"status": "timeout" if timed_out else "error", "error": tail[0][:300]}
            running.remove(item)
            r = results[c]
            print(f"{c.name:27} {r.get('status'):7} alloc {r.get('measured_peak_allocated_bytes')} (plan "
                  f"{plans[c]['planned_peak_allocated_bytes']}) host {r.get('measured_host_bytes')} (plan "
                  f"{plans[c]['planned_host_bytes']}) {r.get('error') or ''} {time.time() - t0:.0f} s", flush=True)
            # Written after every case, so that a run stopped from outside keeps what it measured.
            partial = [row(x, results.get(x, {"status": "pending"}), plans[x]) for x in grid]
            (out_dir / grid_file_name(args.precision)).write_text(json.dumps(partial, indent=1), encoding="utf-8")
            if all(x in results for x in grid if x.arch == c.arch) and c.arch in ckpts:
                shutil.rmtree(Path(ckpts[c.arch]), ignore_errors=True)  # room for the next shapes
    shutil.rmtree(root, ignore_errors=True)
    rows = [row(c, results.get(c, {"status": "skipped"}), plans[c]) for c in grid]
    (out_dir / grid_file_name(args.precision)).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(table(rows))
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"done in {time.time() - start:.0f} s: {ok} of {len(rows)} ok", flush=True)
    return 0


def _bf16_bytes(config: dict[str, Any]) -> int:
    from vramscope.planner.shapes import shape_from_config

    return 2 * int(shape_from_config(config).total_params())


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/distributed.md: strategy x world size x offload, planned vs rehearsed."""
    lines = ["| model | strategy | GPUs | offload | planned alloc | rehearsed alloc | error | planned host | "
             "rehearsed host | status |", "|---|---|---|---|---|---|---|---|---|---|"]

    def g(v: Any) -> str:
        return f"{v / 2**30:.2f} GiB" if isinstance(v, int) else "-"

    for r in rows:
        err = f"{r['allocated_error'] * 100:+.1f}%" if r.get("allocated_error") is not None else "-"
        host = r["offload"] != "none"
        lines.append(f"| {r['arch']} | {r['strategy'].upper()} | {r['world_size']} | {r['offload']} | "
                     f"{g(r['planned_peak_allocated_bytes'])} | {g(r['measured_peak_allocated_bytes'])} | {err} | "
                     f"{g(r['planned_host_bytes']) if host else '-'} | {g(r['measured_host_bytes'])} "
                     f"| {r['status']}{': ' + r['error'][:60] if r.get('error') else ''} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the TRL rehearsals (docs)
# PEFT's FSDP-QLoRA recipe's accelerate config (huggingface/peft examples/sft/configs/fsdp_config_qlora.yaml) at
# two processes, parameters on the GPU: the `fsdp.yaml` of docs/distributed.md.
FSDP_YAML = """compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: false
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
use_cpu: false
"""
TRL_ARCH = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
            "max_position_embeddings": 4096, "pad_token_id": 0, "eos_token_id": 2}  # TinyLlama-1.1B's shape


def make_trl_model(folder: Path) -> tuple[Path, Path]:
    """A random TinyLlama-shaped model with a word-level tokenizer, and a JSON-lines dataset beside it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    model_dir, data_dir = folder / "model", folder / "data"
    words = [f"w{i}" for i in range(TRL_ARCH["vocab_size"] - 3)]
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                            eos_token="</s>").save_pretrained(model_dir)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(LlamaConfig(**TRL_ARCH)).to(torch.bfloat16)
    model.save_pretrained(model_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "train.jsonl", "w", encoding="utf-8") as f:
        for i in range(64):
            f.write(json.dumps({"text": " ".join(words[(i * 131 + j) % len(words)] for j in range(600))}) + "\n")
    (folder / "fsdp.yaml").write_text(FSDP_YAML, encoding="utf-8")
    return model_dir, data_dir


def trl_commands(folder: Path, python: str = "python3") -> dict[str, list[str]]:
    """`vramscope tune --gpus 2 -- <launcher> trl sft ...`, behind accelerate launch (FSDP-QLoRA) and torchrun."""
    model, data = folder / "model", folder / "data"
    sft = ["-m", "trl.scripts.sft", "--model_name_or_path", str(model), "--dataset_name", str(data),
           "--use_peft", "--load_in_4bit", "--use_bnb_nested_quant", "--bnb_4bit_quant_storage", "bfloat16",
           "--dtype", "bfloat16", "--lora_r", "64", "--lora_alpha", "16", "--lora_target_modules", "all-linear",
           "--gradient_checkpointing", "--gradient_checkpointing_kwargs", '{"use_reentrant": false}', "--bf16", "True",
           "--per_device_train_batch_size", "1", "--max_length", "2048",
           "--output_dir", str(folder / "out"), "--report_to", "none", "--max_steps", "100"]
    tune = [python, "-m", "vramscope", "tune", "--gpus", "2", "--gpu-memory", "24GiB", "--"]
    return {"accelerate_fsdp": [*tune, "accelerate", "launch", "--config_file", str(folder / "fsdp.yaml"), *sft],
            "torchrun_ddp": [*tune, "torchrun", "--nproc_per_node", "2", *sft]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/multigpu")
    parser.add_argument("--arch", nargs="+", default=["7b", "13b", "70b"], choices=sorted(ARCHS))
    parser.add_argument("--worlds", nargs="+", type=int, default=list(WORLDS))
    parser.add_argument("--parallel", type=int, default=6, help="cases at once on the one GPU (default 6)")
    parser.add_argument("--gpu-budget", type=int, default=80, metavar="GIB",
                        help="GPU memory the cases running at once may take together (default 80)")
    parser.add_argument("--budget", type=int, default=BUDGET_S, metavar="S", help="seconds for the whole grid")
    parser.add_argument("--precision", choices=sorted(PLANNED_FRAMEWORK), default="fp32",
                        help="fp32: no autocast (planned as loop-loss; the committed grid); autocast: bf16 autocast "
                        "around the forward (planned as hf, the HF Trainer's run)")
    parser.add_argument("--tiny", action="store_true", help="CPU: a tiny 4-bit Llama through the same code")
    parser.add_argument("--only", metavar="REGEX", help="only the cases whose name (7b-fsdp8-offload) matches")
    parser.add_argument("--dry-run", action="store_true", help="print every case's command and plan; run nothing")
    parser.add_argument("--trl", metavar="DIR", help="write the TRL rehearsal's model, data and fsdp.yaml in DIR "
                        "(unless --dry-run) and print its two commands, one a line")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(Case(**json.loads(args.child)), args.ckpt, args.tiny)
    if args.trl:
        if not args.dry_run:
            make_trl_model(Path(args.trl))
        import shlex

        for name, cmd in trl_commands(Path(args.trl)).items():
            print(f"{name} {shlex.join(cmd)}")
        return 0
    return run_grid(args)


if __name__ == "__main__":
    raise SystemExit(main())
