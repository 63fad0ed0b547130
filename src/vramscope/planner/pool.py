"""The caching allocator's pool from one phase to the next: which of an evaluation's large tensors the blocks a
training step left cached can hold, and which open segments of their own that stay reserved afterwards.

torch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) serves a request of more than 1 MiB from the
smallest cached free block at least as large (best fit, splitting it), and only when no block is large enough
asks CUDA for a new segment of the request's size (rounded up to 2 MiB above 10 MiB). Neither HF Trainer nor TRL
empties the cache before ``evaluate()``, so an evaluation in the middle of training starts with the blocks the
training step freed, and what it cannot place there stays reserved for the rest of the run.

An evaluation is a no-grad forward, usually at ``per_device_eval_batch_size`` rows, larger than the training
batch: its activations are wider than any the step made, and only the step's few large blocks (the fused head's
tile, the dequantized weights, the logits, autocast's half copy of an fp32 lm_head) can take them. This module
lists those blocks by kind and count (:func:`train_blocks`), the evaluation's large tensors alive at once in
each of its moments (:func:`eval_moments`), and replays the best fit (:func:`new_segments`). Tensors below
:data:`LARGE` are left out: they come from the small pool or fit anywhere.

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from vramscope.planner.frameworks import TOKEN_TILE, VOCAB_TILE, Framework, Precision
from vramscope.planner.layer import lora_modules, lora_tensors, merged_expert_bytes
from vramscope.planner.shapes import Linear, ModelShape
from vramscope.recipe import QLoraSpec
from vramscope.units import MIB

LARGE = 10 * MIB  # requests above this get a segment of exactly their (rounded) size
ROUND_LARGE = 2 * MIB
REPLAYED_STEPS = 8  # eval batches replayed with their cached containers (see eval_loop_segments)
SMALL = 1 * MIB  # requests up to this come from the small pool's 2 MiB segments
# torch's cuBLAS workspace on sm90 (32 MiB, seen on the H200), one per thread that runs a matmul: the forward's and
# autograd's. Smaller on older GPUs: counting the sm90 size errs toward a smaller free region, the safe side.
CUBLAS_WORKSPACE = 32 * MIB
_MLP_IN = ("gate_proj", "up_proj", "gate_up_proj", "dense_h_to_4h")


def segment_bytes(n: int) -> int:
    """The segment CUDA is asked for when a request of ``n`` bytes fits no cached block."""
    return int(math.ceil(n / ROUND_LARGE) * ROUND_LARGE)


class _Cache:
    """The allocator's cached free blocks and the segments opened so far (large requests only)."""

    def __init__(self, blocks: Sequence[int]) -> None:
        self.free = sorted(segment_bytes(b) for b in blocks if b > LARGE)
        self.opened = 0

    def take(self, size: int, available: list[int] | None = None) -> int:
        """Place a tensor: the smallest free block at least its size, or a segment of its own. Returns the block."""
        pool = self.free if available is None else available
        i = bisect.bisect_left(pool, size)
        if i < len(pool):
            return pool.pop(i)
        self.opened += size
        if available is not None:
            self.free.append(size)  # cached once the moment ends
        return size

    def moment(self, tensors: Sequence[int]) -> None:
        """Tensors alive at once, freed together afterwards: every block they took returns whole (split parts
        coalesce), the new segments among them."""
        available = list(self.free)
        for size in sorted((segment_bytes(t) for t in tensors if t > LARGE), reverse=True):
            block = self.take(size, available)
            if block - size > LARGE:
                bisect.insort(available, block - size)
        self.free.sort()

    def release(self, block: int) -> None:
        bisect.insort(self.free, block)


def new_segments(pool: Sequence[int], moments: Sequence[Sequence[int]]) -> int:
    """Bytes of new segments a sequence of moments opens beside a cached ``pool`` of free blocks.

    Each moment's tensors are alive at once: each takes the smallest free block at least its size (the rest of
    that block stays free), or opens a segment of its own. At the end of a moment its tensors are freed and every
    block returns whole, the new segments among them, for the moments after it.
    """
    cache = _Cache(pool)
    for moment in moments:
        cache.moment(moment)
    return cache.opened


def eval_loop_segments(pool: Sequence[int], moments: Sequence[Sequence[int]], held_per_step: int, steps: int,
                       accumulate_every: int | None = None) -> int:
    """Bytes of new segments an evaluation loop opens over ``steps`` batches (transformers ``evaluation_loop``).

    Every step runs ``moments`` (one forward); with ``held_per_step`` (the fp32 logits that compute_metrics
    keeps) its returned logits stay in their block, the container takes the first batch's as they are and
    concatenates every later one into a new tensor of all rows so far (``EvalLoopContainer``), freeing the old
    one; ``accumulate_every`` (``eval_accumulation_steps``) moves the container to the host. Held blocks are
    out of the pool, so the next forward's logits need blocks again.
    """
    cache = _Cache(pool)
    held = segment_bytes(held_per_step) if held_per_step > LARGE else 0
    if not held:
        for moment in moments:
            cache.moment(moment)
        return cache.opened
    if accumulate_every:
        steps = min(steps, 2 * accumulate_every + 1)  # after the first move to the host the cycles repeat
    replayed = min(steps, REPLAYED_STEPS)
    container = 0  # the block holding the gathered predictions
    gathered = 0  # batches in it
    for _ in range(replayed):
        for moment in moments:
            cache.moment(moment)
        returned = cache.take(held)
        if not container:
            container, gathered = returned, 1
        else:
            grown = cache.take(held * (gathered + 1))
            cache.release(container)
            cache.release(returned)
            container, gathered = grown, gathered + 1
        if accumulate_every and gathered == accumulate_every:
            cache.release(container)
            container, gathered = 0, 0
    # Past the replayed steps each concatenation would open a larger segment still, the old containers staying
    # cached, but only while the GPU has room: on a failed cudaMalloc the allocator releases its unused cached
    # blocks and retries (``release_cached_blocks``), so a long evaluation's reserved is bounded by the GPU, and
    # its allocated peak (the containers alive at once, planned step by step in phases.py) decides the fit.
    return cache.opened


def _act_bytes(fw: Framework, pr: Precision) -> int:
    """dtype size of a linear layer's output and the MLP's activations: half under autocast."""
    return 2 if fw.autocast else pr.stream


def _dequantized(shape: ModelShape, spec: QLoraSpec, pr: Precision) -> list[int]:
    """One block per 4/8-bit linear of a layer: its weight dequantized to the compute dtype for the matmul.

    Each linear's dequantized weight is freed right after its matmul, and the layer's next, smaller activation
    takes that block by best fit (splitting it), so the next linear's dequantization finds no free block of its
    size and opens its own segment: a layer leaves one such segment per linear."""
    if spec.bits not in (4, 8):
        return []
    return [pr.compute * lin.params for lin in shape.linears]


def _lora_linear(lin: Linear, lora: bool, act: int, T: int) -> list[int]:
    """A linear's output tensors alive at once: with LoRA (peft's 4-bit ``Linear4bit.forward``) the base
    result's defensive clone, the adapter's scaled output and their sum; without, the output."""
    out = act * lin.out_features * T
    return [out, out, out] if lora else [out]


def _mlp_moments(shape: ModelShape, spec: QLoraSpec, fw: Framework, pr: Precision, T: int) -> list[list[int]]:
    """The large tensors of one dense MLP's forward, moment by moment (transformers' ``down(act(gate(x)) *
    up(x))``, or Phi-3's fused ``gate_up`` chunked in two; a plain ``down(act(up(x)))``)."""
    if shape.experts:
        # routed experts: per-expert slices of the tokens, smaller than the dense blocks; adapted experts (peft's
        # ParamWrapper) make both merged stacks for the experts' call, no-grad or not
        merged = [size for size in merged_expert_bytes(shape, spec, pr) if size]
        return [merged] if merged else []
    act = _act_bytes(fw, pr)
    lora = {lin.name for lin in lora_modules(shape, spec)}
    by_name = {lin.name: lin for lin in shape.linears}
    deq = {lin.name: pr.compute * lin.params if spec.bits in (4, 8) else 0 for lin in shape.linears}
    inter = act * shape.intermediate * T
    moments: list[list[int]] = []
    if "gate_up_proj" in by_name:
        lin = by_name["gate_up_proj"]
        moments.append([deq[lin.name], *_lora_linear(lin, lin.name in lora, act, T)])
        moments.append([act * lin.out_features * T, inter, inter])  # gate_up, act(gate), the product
    elif "gate_proj" in by_name and "up_proj" in by_name:
        gate, up = by_name["gate_proj"], by_name["up_proj"]
        moments.append([deq[gate.name], *_lora_linear(gate, gate.name in lora, act, T)])
        moments.append([inter, deq[up.name], *_lora_linear(up, up.name in lora, act, T)])  # act(gate) alive
        moments.append([inter, inter, inter])  # act(gate), up, their product
    else:
        first = next((lin for lin in shape.linears if lin.name in _MLP_IN), None)
        if first is not None:
            moments.append([deq[first.name], *_lora_linear(first, first.name in lora, act, T)])
            moments.append([inter, inter])
    down = next((lin for lin in shape.linears if lin.source == "mlp_act"), None)
    if down is not None:
        moments.append([inter, deq[down.name], *_lora_linear(down, down.name in lora, act, T)])
    return moments


def _head_blocks(shape: ModelShape, fw: Framework, pr: Precision, T: int, grad: bool) -> list[list[int]]:
    """The LM head's large tensors, moment by moment, in a training step (``grad``) or a no-grad forward."""
    V, h = shape.vocab, shape.hidden
    if fw.logits == "score":
        return []
    if fw.logits == "chunked":
        # TRL's fused head: one [min(T, 4096), 32768] tile in the compute dtype (forward, and again in backward,
        # after the forward's is freed), and backward's fp32 gradient of the gathered hidden rows
        tile = 2 * min(T, TOKEN_TILE) * VOCAB_TILE
        return [[tile, 4 * h * T]] if grad else [[tile]]
    half_head = 2 * V * h if fw.autocast and pr.params == 4 else 0  # autocast's cast of an fp32 lm_head
    logits_b = 2 if fw.autocast else pr.params
    upcast = 4 * T * V if logits_b != 4 else 0  # transformers' loss: logits.float()
    moments = [[half_head, logits_b * T * V]]
    # the loss: the fp32 logits and their log-softmax; in backward their gradient beside them
    moments.append([logits_b * T * V if upcast else 0, upcast or 4 * T * V, 4 * T * V] + ([4 * T * V] if grad
                                                                                           else []))
    return moments


def loading_region(shape: ModelShape, spec: QLoraSpec, fw: Framework, pr: Precision) -> int:
    """The free block peft's ``prepare_model_for_kbit_training`` leaves inside the loading segment, less what the
    adapters and cuBLAS take from it before the first step ends (0 where there is none).

    transformers 5 opens one segment for the whole checkpoint (``caching_allocator_warmup``) and loads the
    targets in natural-key order, so ``lm_head`` and ``model.embed_tokens`` sit side by side at its start. The
    upcast gives each an fp32 copy in a segment of its own (the region is smaller than either copy) and frees the
    16-bit originals: one free region of their size (seen on the H200 with Qwen2.5-7B, 2079 MiB; Llama-3.1-8B,
    2004; Phi-3-mini, 376). peft then makes the adapters, whose tensors above 1 MiB best-fit into it, and each
    matmul thread's first cuBLAS call puts its workspace there. What is left is one free block after every step
    (the step's tensors carved from it are all freed), and an evaluation's widest tensor can take it: Qwen2.5-7B's
    fp32 upcast of ``[2048, 152064]`` logits (1188 MiB) did, where the plan had opened a segment. Where the
    workspaces land inside it is the allocator's choice: the H200 left 1646 MiB (Qwen2.5-7B; 1766 by this count)
    and 1732 MiB (Llama-3.1-8B; 1720). A model loaded in fp32 is not upcast and leaves no region."""
    if not (fw.prepares_kbit and spec.bits in (4, 8)) or pr.compute == 4:
        return 0
    freed = pr.compute * (shape.embedding_params + shape.lm_head_params)
    adapters = sum(_rounded(pr.lora_param * n) for n in lora_tensors(shape, spec) if pr.lora_param * n > SMALL)
    left = freed - adapters - 2 * CUBLAS_WORKSPACE
    return left if left > LARGE else 0


def _rounded(n: int) -> int:
    """A request's block size: the allocator rounds every request up to 512 bytes."""
    return -(-n // 512) * 512


def train_blocks(shape: ModelShape, spec: QLoraSpec, fw: Framework, pr: Precision, rows: int, seq: int,
                 region: int = 0) -> list[int]:
    """The large blocks the pool holds after a training step of ``rows x seq``: the loading ``region`` it started
    with (:func:`loading_region`) and those the step made, of each kind as many as it held at once (the
    dequantized weights, one MLP's activations, the head's tiles or logits).

    The step's saved tensors take their part of the region first (at the first forward it is the one large free
    block, so best fit puts them there): under gradient checkpointing each layer's input, otherwise all of it. A
    step's tensor takes what is left of the region before a new block of its own: autocast's half ``lm_head`` did
    on Qwen2.5-7B and Llama-3.1-8B (1039.5 and 1002 MiB beside 392 and 512 MiB of checkpoints), and opened its
    own segment on Mistral-Nemo-12B (1280 MiB; 800 of checkpoints) and Gemma-2-9B. After the step the region is
    whole again, for the evaluation."""
    T = rows * seq
    moments = _mlp_moments(shape, spec, fw, pr, T) + _head_blocks(shape, fw, pr, T, grad=True)
    usable = region - _saved_in_region(shape, spec, pr, T, region)
    blocks: list[int] = ([usable] if usable > LARGE else []) + list(_dequantized(shape, spec, pr))
    # adapted experts: each merged stack and its gradient, one cached block each (layer.merged_expert_pool)
    blocks += [size for size in merged_expert_bytes(shape, spec, pr) if size] * 2
    # a kind's block count is the most the step held at once; blocks already listed are reused, not added
    for moment in moments:
        need = sorted((t for t in moment if t > LARGE), reverse=True)
        have = sorted(blocks)
        for size in need:
            i = bisect.bisect_left(have, size)
            if i < len(have):
                have.pop(i)
            else:
                blocks.append(size)
    if usable > LARGE:
        blocks.remove(usable)
    return ([region] if region > LARGE else []) + blocks


def _saved_in_region(shape: ModelShape, spec: QLoraSpec, pr: Precision, tokens: int, region: int) -> int:
    """What of the loading region the step's saved tensors hold at its head: each layer's checkpointed input
    (above 1 MiB, from the large pool) under gradient checkpointing; without it, the saved activations fill it."""
    if not spec.gradient_checkpointing:
        return region
    hidden = pr.stream * tokens * shape.hidden
    return shape.layers * _rounded(hidden) if hidden > SMALL else 0


def eval_moments(shape: ModelShape, spec: QLoraSpec, fw: Framework, pr: Precision, rows: int,
                 seq: int) -> list[list[int]]:
    """An evaluation forward's large tensors, moment by moment (one decoder layer's MLP, then the head)."""
    T = rows * seq
    return _mlp_moments(shape, spec, fw, pr, T) + _head_blocks(shape, fw, pr, T, grad=False)
