"""Each tool's reader on the commands people paste (issue 26): 4-bit in every spelling, LLaMA-Factory, Unsloth,
TRL's DPO/GRPO scripts by path, ms-swift, scripts read statically, settings that change memory, multi-GPU facts.

Real files in a temporary folder, real parse_command; the scripts are read with ast and never run (a script that
would raise or write a file when imported is read all the same, and nothing is written).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from vramscope.commands import CommandReadError, ParsedCommand, parse_command
from vramscope.commands.dispatch import PROGRAMS
from vramscope.commands.scripts import read_script


def parse(cmd: str, cwd: Path, **env: str) -> ParsedCommand:
    return parse_command(shlex.split(cmd), cwd=cwd, environ={"HOME": str(cwd), **env})


PEFT_FLAGS = ("--model_name_or_path mistralai/Mistral-7B-v0.1 --use_peft_lora True --lora_r 8 --max_length 2048 "
              "--per_device_train_batch_size 2 --bf16 True")


def write_sft_script(folder: Path, body: str = "") -> None:
    """A user's script in the shape of PEFT's examples/sft/train.py: HfArgumentParser over SFTConfig, SFTTrainer."""
    (folder / "train.py").write_text(
        "import sys\nfrom dataclasses import dataclass, field\nfrom transformers import HfArgumentParser, "
        "BitsAndBytesConfig, AutoModelForCausalLM\nfrom trl import SFTConfig, SFTTrainer\n"
        "open('SIDE_EFFECT', 'w').write('ran')\nsys.exit(3)\n"
        "@dataclass\nclass ModelArguments:\n    use_4bit_quantization: bool = field(default=False)\n"
        "    use_peft_lora: bool = field(default=False)\n    lora_r: int = field(default=64)\n"
        "    max_seq_length: int = field(default=512)\n"
        f"{body}"
        "parser = HfArgumentParser((ModelArguments, SFTConfig))\n"
        "SFTTrainer(model=AutoModelForCausalLM.from_pretrained('m', quantization_config=bnb))\n")


@pytest.mark.parametrize(("flags", "bits"), [
    ("--use_4bit_quantization True", 4),  # PEFT's examples and their copies
    ("--load_in_4bit", 4),
    ("--q_lora True", 4),  # FastChat's spelling
    ("--quantization 4bit", 4),
    ("--use_8bit_quantization True", 8),
    ("--use_4bit_quantization False", 16),
])
def test_four_bit_in_every_spelling_a_script_takes(tmp_path: Path, flags: str, bits: int) -> None:
    write_sft_script(tmp_path)
    p = parse(f"python train.py {PEFT_FLAGS} {flags}", tmp_path)
    assert p.spec.bits == bits and not any("bit" in a for a in p.assumed)
    assert not (tmp_path / "SIDE_EFFECT").exists()  # read with ast, never run


def test_a_script_read_statically_its_trainer_defaults_and_bitsandbytes(tmp_path: Path) -> None:
    write_sft_script(tmp_path, "bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)\n")
    p = parse("python train.py --model_name_or_path m --use_peft_lora True --per_device_train_batch_size 2",
              tmp_path)
    assert p.framework == "trl" and p.trainer.kind == "sft"  # it builds TRL's SFTTrainer
    assert p.spec.bits == 4 and p.memory.quant_storage == "bf16"  # from the BitsAndBytesConfig in its code
    assert p.seq_len == 512 and p.read["max_seq_length (train.py default)"] == "512"  # its dataclass default
    assert p.spec.lora_r == 64 and p.spec.gradient_checkpointing is True  # its default; SFTConfig's
    assert not (tmp_path / "SIDE_EFFECT").exists()
    with pytest.raises(CommandReadError, match="every parameter"):  # use_peft_lora defaults to False there
        parse("python train.py --model_name_or_path m", tmp_path)


def test_a_script_that_hides_how_it_loads_is_planned_both_ways(tmp_path: Path) -> None:
    (tmp_path / "run.py").write_text("from transformers import HfArgumentParser, Trainer\nimport helpers\n"
                                     "model = helpers.load()\nTrainer(model=model)\n")
    p = parse("python run.py --model_name_or_path m --per_device_train_batch_size 1 --max_seq_length 256", tmp_path)
    assert p.spec.bits == 16 and any(a.startswith("16-bit base") for a in p.assumed)
    assert any("rank" in a for a in p.assumed)
    assert [(a.label, dict(a.spec)) for a in p.alternatives] == [
        ("if the script loads the model in 4-bit", {"bits": 4})]
    (tmp_path / "plain.py").write_text("from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer\n"
                                       "Trainer(model=AutoModelForCausalLM.from_pretrained('m'))\n")
    q = parse("python plain.py --model_name_or_path m --lora_r 8 --max_seq_length 256", tmp_path)
    assert q.spec.bits == 16 and q.assumed == () and q.alternatives == ()  # loads in sight, unquantized


def test_read_script_takes_literals_and_names_only() -> None:
    facts = read_script("import torch\nfrom unsloth import FastLanguageModel\nmax_seq_length = 2048\nr = 16\n"
                        "model, tok = FastLanguageModel.from_pretrained(model_name='unsloth/x', "
                        "max_seq_length=max_seq_length, dtype=torch.bfloat16, load_in_4bit=flag)\n"
                        "model = FastLanguageModel.get_peft_model(model, r=r * 2, lora_alpha=r)\n")
    assert facts.unsloth_load == {"model_name": "unsloth/x", "max_seq_length": 2048, "dtype": "bfloat16"}
    assert facts.unsloth_peft == {"lora_alpha": 16}  # r * 2 is not a literal: left out, not guessed
    assert facts.uses_unsloth and read_script("def broken(:\n").parses is False
    notebook = read_script("%%capture\n!pip install unsloth\nfrom unsloth import FastLanguageModel\n")
    assert notebook.parses and notebook.uses_unsloth  # a notebook saved as .py, magics and all


def test_llamafactory_in_its_three_forms(tmp_path: Path) -> None:
    (tmp_path / "qlora.yaml").write_text(
        "model_name_or_path: Qwen/Qwen2.5-7B\nstage: dpo\nfinetuning_type: lora\nlora_rank: 16\n"
        "lora_target: all\nquantization_bit: 4\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 8\n"
        "bf16: true\ndataset: dpo_en_demo,identity\ndataset_dir: data\nadditional_target: embed_tokens,lm_head\n")
    p = parse("llamafactory-cli train qlora.yaml learning_rate=1e-5", tmp_path)
    assert (p.program, p.framework, p.trainer.kind) == ("llamafactory", "hf", "dpo")
    assert (p.spec.bits, p.spec.lora_r, p.spec.lora_alpha, p.spec.lora_targets) == (4, 16, 32, None)
    assert (p.batch_size, p.grad_accum, p.seq_len, p.spec.gradient_checkpointing) == (2, 8, 2048, True)
    assert p.dataset.names == ("dpo_en_demo", "identity") and p.dataset.dataset_dir == "data"
    assert p.memory.modules_to_save == ("embed_tokens", "lm_head")
    # DPO is planned (the planner's dpo phase); modules_to_save trained in full is not modelled: said so
    assert any("modules_to_save" in u for u in p.unsupported) and not any("DPO" in u for u in p.unsupported)
    q = parse("llamafactory-cli train qlora.yaml", tmp_path, FORCE_TORCHRUN="1")
    assert q.launch.world_size is None  # torchrun over every visible GPU
    r = parse("FORCE_TORCHRUN=1 NNODES=2 NPROC_PER_NODE=2 llamafactory-cli train qlora.yaml", tmp_path)
    assert (r.launch.world_size, r.launch.nodes, r.launch.strategy) == (4, 2, "ddp")
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\nnum_processes: 2\n")
    (tmp_path / "src").mkdir()
    s = parse("accelerate launch --config_file fsdp.yaml src/train.py qlora.yaml", tmp_path)
    assert (s.program, s.launch.world_size, s.launch.strategy, s.spec.bits) == ("llamafactory", 2, "fsdp", 4)


def test_unsloth_checkpointing_unsloth_is_on_and_r_is_the_rank(tmp_path: Path) -> None:
    p = parse("python unsloth-cli.py --model_name unsloth/llama-3-8b --max_seq_length 4096 --load_in_4bit --r 32 "
              "--use_gradient_checkpointing unsloth", tmp_path)
    assert (p.program, p.framework, p.spec.lora_r, p.spec.bits, p.seq_len) == ("unsloth", "unsloth", 32, 4, 4096)
    assert p.spec.gradient_checkpointing is True and p.memory.checkpoint_offload is True
    assert (p.batch_size, p.grad_accum, p.spec.optim) == (2, 4, "adamw_8bit")  # unsloth-cli.py's defaults
    (tmp_path / "nb.py").write_text(
        "from unsloth import FastLanguageModel\nfrom trl import GRPOConfig, GRPOTrainer\nmax_seq_length = 1024\n"
        "model, tok = FastLanguageModel.from_pretrained(model_name='unsloth/Qwen2.5-3B-Instruct', "
        "max_seq_length=max_seq_length, fast_inference=True, gpu_memory_utilization=0.5)\n"
        "model = FastLanguageModel.get_peft_model(model, r=64, lora_alpha=64)\n"
        "GRPOTrainer(model=model, args=GRPOConfig(per_device_train_batch_size=1, num_generations=6, "
        "max_prompt_length=256, max_completion_length=200))\n")
    q = parse("python nb.py", tmp_path)
    assert (q.program, q.trainer.kind, q.spec.bits, q.spec.lora_r) == ("unsloth", "grpo", 4, 64)
    t = q.trainer
    assert (t.num_generations, t.max_prompt_length, t.max_completion_length, q.seq_len) == (6, 256, 200, 456)
    assert t.use_vllm and t.vllm_gpu_memory_utilization == 0.5 and any("vLLM" in u for u in q.unsupported)


def test_trl_dpo_and_grpo_scripts_by_path_with_their_defaults(tmp_path: Path) -> None:
    p = parse("python trl/scripts/dpo.py --model_name_or_path Qwen/Qwen2-0.5B-Instruct --use_peft --lora_r 32 "
              "--per_device_train_batch_size 2 --eval_strategy steps --per_device_eval_batch_size 4", tmp_path)
    assert (p.program, p.framework, p.trainer.kind, p.seq_len, p.spec.lora_r) == ("trl", "trl", "dpo", 1024, 32)
    assert p.defaults["max_length"] == "1024" and p.spec.gradient_checkpointing is True
    assert p.eval.evaluates and p.eval.per_device_eval_batch_size == 4
    g = parse("accelerate launch --num_processes 2 examples/scripts/grpo_vlm.py --model_name_or_path "
              "Qwen/Qwen2.5-VL-3B-Instruct --use_peft --max_completion_length 1024 --use_vllm --vllm_mode colocate",
              tmp_path)
    assert (g.trainer.kind, g.trainer.num_generations, g.trainer.max_completion_length) == ("grpo", 8, 1024)
    assert g.seq_len == 512 + 1024 and any("prompt" in a for a in g.assumed)  # TRL 1.16 does not cut prompts
    assert g.memory.vision and g.trainer.use_vllm
    assert [a.seq_len for a in g.alternatives] == [2048 + 1024]  # the guess could flip the verdict: both planned
    (tmp_path / "recipe.yaml").write_text("model_name_or_path: m\nuse_peft: true\nload_in_4bit: true\nlora_r: 128\n"
                                          "max_length: 1024\nmax_prompt_length: 512\nbeta: 0.01\n")
    h = parse("accelerate launch --num_processes=1 scripts/dpo.py recipe.yaml", tmp_path)  # the handbook's form
    assert (h.trainer.kind, h.spec.bits, h.spec.lora_r, h.trainer.max_prompt_length, h.trainer.beta) == (
        "dpo", 4, 128, 512, 0.01)


def test_trl_defaults_match_the_installed_trl_for_every_trainer() -> None:
    trl = pytest.importorskip("trl")
    if not trl.__version__.startswith("1.16"):
        pytest.skip(f"defaults checked against TRL 1.16, found {trl.__version__}")
    from trl import DPOConfig, GRPOConfig, KTOConfig, RewardConfig

    from vramscope.commands.trl import GRPO_COMPLETION, GRPO_GENERATIONS, MAX_LENGTH

    for kind, cls in (("dpo", DPOConfig), ("kto", KTOConfig), ("reward", RewardConfig)):
        assert cls(output_dir="x", use_cpu=True).max_length == MAX_LENGTH[kind]
    grpo = GRPOConfig(output_dir="x", use_cpu=True)
    assert (grpo.num_generations, grpo.max_completion_length) == (GRPO_GENERATIONS, GRPO_COMPLETION)
    assert not hasattr(grpo, "max_prompt_length")  # why the prompt's share is an assumption


def test_swift_reads_model_not_model_name_and_its_quant_flags(tmp_path: Path) -> None:
    p = parse("CUDA_VISIBLE_DEVICES=0,1 NPROC_PER_NODE=2 swift sft --model Qwen/Qwen2.5-7B-Instruct --tuner_type lora "
              "--quant_bits 4 --quant_method bnb --lora_rank 8 --max_length 2048 --per_device_train_batch_size 1 "
              "--model_name swift-robot --deepspeed zero3", tmp_path)
    assert (p.program, p.model, p.spec.bits, p.spec.lora_r, p.spec.lora_alpha) == (
        "swift", "Qwen/Qwen2.5-7B-Instruct", 4, 8, 32)
    assert (p.launch.world_size, p.launch.strategy, p.grad_accum) == (2, "zero3", 8)  # ceil(16 / (1 x 2))
    q = parse("swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-3B-Instruct --use_vllm true --max_length 1024",
              tmp_path)
    assert (q.trainer.kind, q.trainer.num_generations, q.launch.world_size) == ("grpo", 8, 1)
    r = parse("accelerate launch --num_processes 2 swift/cli/sft.py --model Qwen/Qwen2.5-7B --quant_bits 4", tmp_path)
    assert r.program == "swift" and r.spec.bits == 4 and any("max_length" in a for a in r.assumed)


def test_settings_that_change_memory_are_read_and_said_not_modelled(tmp_path: Path) -> None:
    (tmp_path / "ax.yml").write_text(
        "base_model: NousResearch/Meta-Llama-3-8B\nadapter: lora\nlora_r: 16\npeft_use_dora: true\n"
        "lora_modules_to_save:\n  - embed_tokens\n  - lm_head\nplugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
        "liger_fused_linear_cross_entropy: true\nsequence_len: 2048\n")
    p = parse("axolotl train ax.yml", tmp_path)
    assert p.memory.dora and p.memory.liger and p.memory.modules_to_save == ("embed_tokens", "lm_head")
    assert len(p.unsupported) == 3 and all(not u.startswith("does not") for u in p.unsupported)
    (tmp_path / "gptq.yml").write_text("base_model: TheBloke/Llama-2-7B-GPTQ\nadapter: lora\ngptq: true\n")
    g = parse("axolotl train gptq.yml", tmp_path)
    assert g.spec.bits == 4 and g.memory.quant_method == "gptq" and any("GPTQ" in u for u in g.unsupported)
    t = parse("trl sft --model_name_or_path m --use_peft --use_dora --lora_modules_to_save lm_head "
              "--use_liger_kernel --load_in_4bit --bnb_4bit_quant_storage bfloat16", tmp_path)
    assert t.memory.dora and t.memory.liger and t.memory.modules_to_save == ("lm_head",)
    assert t.memory.quant_storage == "bf16"


def test_multi_gpu_facts_are_used(tmp_path: Path) -> None:
    (tmp_path / "fsdp.yml").write_text(
        "base_model: NousResearch/Meta-Llama-3-8B\nadapter: qlora\nload_in_4bit: true\nfsdp:\n  - full_shard\n"
        "fsdp_config:\n  fsdp_offload_params: true\n")
    p = parse("axolotl train fsdp.yml", tmp_path)
    assert (p.launch.world_size, p.launch.strategy, p.launch.offload) == (None, "fsdp", True)
    assert any(a.startswith("processes") for a in p.assumed) and p.alternatives[0].world_size == 8
    q = parse("axolotl train fsdp.yml --launcher torchrun -- --nproc_per_node=2", tmp_path)
    # the count is said now; left is which FSDP (unsaid: axolotl's FSDP1), which the offload's host figure rests on
    assert (q.launch.world_size, q.launch.strategy, q.launch.fsdp_version) == (2, "fsdp", 1)
    assert [a.split(":")[0] for a in q.assumed] == ["FSDP1"]
    r = parse("ACCELERATE_USE_FSDP=1 torchrun --nproc_per_node 4 finetuning.py --enable_fsdp --use_peft "
              "--model_name Llama-3-8B --quantization 4bit", tmp_path)
    assert (r.program, r.launch.world_size, r.launch.strategy, r.spec.bits) == ("cookbook", 4, "fsdp", 4)
    s = parse("python train.py --model_name Llama-2-70B --train_type qlora --batch_size 2 --context_length 512",
              tmp_path)  # Answer.AI's fsdp_qlora: FSDP over every visible GPU with CPU offload by default
    assert (s.program, s.launch.strategy, s.launch.offload, s.spec.lora_r, s.seq_len) == (
        "fsdp_qlora", "fsdp", True, 64, 512)


def test_custom_command_lines(tmp_path: Path) -> None:
    p = parse("hf jobs uv run --flavor a100-large --secrets HF_TOKEN "
              "https://raw.githubusercontent.com/huggingface/trl/main/trl/scripts/sft.py --model_name_or_path "
              "Qwen/Qwen2.5-3B-Instruct --use_peft --lora_r 256 --packing", tmp_path)
    assert (p.program, p.spec.lora_r, p.launch.world_size, p.memory.packing) == ("trl", 256, 1, True)
    q = parse("python -m llama_cookbook.finetuning --use_peft --peft_method lora --quantization int4 "
              "--model_name Llama-3-8B --batch_size_training 2", tmp_path)
    assert (q.program, q.spec.bits, q.batch_size, q.seq_len, q.spec.lora_r) == ("cookbook", 4, 2, 4096, 8)
    assert any("int4" in a for a in q.assumed)  # the cookbook itself takes 4bit or 8bit
    (tmp_path / "ax.yml").write_text("base_model: Llama-2-7B\nadapter: lora\ndeepspeed: deepspeed_configs/zero3.json\n")
    r = parse("axolotl train ax.yml", tmp_path)  # the file is on another machine: a warning, not fatal
    assert r.launch.strategy == "zero3" and any("deepspeed" in a for a in r.assumed)
    s = parse("python qlora.py --model_name_or_path huggyllama/llama-7b", tmp_path)
    assert s.spec.compute_dtype == "fp32"  # qlora.py without --bf16 computes in fp32, and is planned so


def test_every_program_in_the_table_has_a_title_and_a_reader() -> None:
    assert {"trl", "qlora", "hf", "axolotl", "llamafactory", "swift", "unsloth", "fsdp_qlora", "cookbook",
            "fastchat"} == set(PROGRAMS)
    assert all(callable(p.read) and p.title for p in PROGRAMS.values())


def test_what_others_need_of_a_program_is_a_field_its_reader_fills(tmp_path: Path) -> None:
    (tmp_path / "ax.yml").write_text("base_model: NousResearch/Llama-2-7b-hf\nadapter: qlora\nval_set_size: 0.1\n")
    ax = parse("axolotl train ax.yml", tmp_path)
    assert (ax.batch_flag, ax.seq_flag, ax.accum_flag) == ("micro_batch_size", "sequence_len",
                                                           "gradient_accumulation_steps")
    assert ax.flags_in_config and ax.eval_batch_follows_train and (ax.title, ax.title_names_trainer) == ("axolotl",
                                                                                                         False)
    qlora = parse("python qlora.py", tmp_path)
    assert qlora.seq_parts == ("--source_max_len", "--target_max_len") and not qlora.flags_in_config
    dpo = parse("trl dpo --model_name_or_path m --use_peft", tmp_path)
    assert (dpo.title, dpo.title_names_trainer, dpo.accum_flag) == ("TRL dpo", True, "--gradient_accumulation_steps")
    assert not dpo.eval_batch_follows_train and not dpo.seq_parts


def test_where_a_program_keeps_its_config_is_its_rows_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    # LLaMA-Factory's row: a .json config too, key=value words override it, and one line where there is none.
    (tmp_path / "lf.json").write_text(json.dumps({"model_name_or_path": "NousResearch/Llama-2-7b-hf", "stage": "sft",
                                                  "finetuning_type": "lora", "per_device_train_batch_size": 2,
                                                  "cutoff_len": 1024}), encoding="utf-8")
    lf = parse("llamafactory-cli train lf.json per_device_train_batch_size=6", tmp_path)
    assert (lf.config_path, lf.batch_size, lf.seq_len) == (str(tmp_path / "lf.json"), 6, 1024)
    with pytest.raises(CommandReadError, match=r"^llamafactory-cli train needs its config file \(llamafactory-cli "
                                               r"train examples/train_lora/x.yaml\); plan it with"):
        parse("llamafactory-cli train", tmp_path)
    # axolotl's row says a YAML and a required one; the same fields on it change how its command is read.
    (tmp_path / "ax.json").write_text(json.dumps({"base_model": "NousResearch/Llama-2-7b-hf", "load_in_4bit": True,
                                                  "adapter": "qlora", "sequence_len": 1024, "micro_batch_size": 2,
                                                  "lora_r": 8}), encoding="utf-8")
    with pytest.raises(CommandReadError, match=r"^axolotl train needs its config file \(axolotl train config.yml\)"):
        parse("axolotl train ax.json micro_batch_size=5", tmp_path)
    from dataclasses import replace

    monkeypatch.setitem(PROGRAMS, "axolotl", replace(PROGRAMS["axolotl"], config_suffixes=(".json",),
                                                     config_overrides=True, config_missing="axolotl wants a JSON"))
    ax = parse("axolotl train ax.json micro_batch_size=5", tmp_path)
    assert (ax.config_path, ax.batch_size, ax.seq_len, ax.unknown) == (str(tmp_path / "ax.json"), 5, 1024, ())
    with pytest.raises(CommandReadError, match=r"^axolotl wants a JSON; plan it with"):
        parse("axolotl train ax.yml", tmp_path)
    # The fallback row (any script) reads only a command that looks like an HF Trainer script's.
    (tmp_path / "train.py").write_text("print('hello')\n", encoding="utf-8")
    with pytest.raises(CommandReadError, match="it is not a command of a tool vramscope reads"):
        parse("python train.py --foo 1", tmp_path)


def program_compares(source: str) -> list[str]:
    """Each comparison in ``source`` with a program's name (a key of ``PROGRAMS``) as a string literal;
    dataset/'s layouts are named ``sft``/``hf`` too (a ``trainer``, not a program)."""
    import ast

    def literals(node: ast.expr) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {v for e in node.elts for v in literals(e)}
        return set()

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            trainer = any(isinstance(o, ast.Name) and o.id == "trainer" for o in operands)
            if {v for o in operands for v in literals(o)} & set(PROGRAMS) and not trainer:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_commands_compares_with_a_programs_name() -> None:
    # tune/ and cli/ read ParsedCommand's fields (accum_flag, flags_in_config, seq_parts, eval_batch_follows_train,
    # title; Target.worker/starts for a relaunch) instead of `parsed.program == "axolotl"`: a new program is a
    # reader, not an if in each of them. commands/__init__.py too: where a program's config file is, whether it
    # needs one, whether key=value words override it and whether its command must look like an HF Trainer
    # script are fields of its row in commands/dispatch.PROGRAMS.
    for before in ('parsed.program == "axolotl"', 'p.program == "trl"', 'kind in ("accelerate", "trl", "axolotl")'):
        assert program_compares(before), before
    assert not program_compares('trainer in ("sft", "hf")') and not program_compares('kind == "deepspeed"')
    src = Path(__file__).resolve().parent.parent / "src" / "vramscope"
    found = {str(path.relative_to(src)): program_compares(path.read_text(encoding="utf-8"))
             for path in sorted(src.rglob("*.py"))
             if src / "commands" not in path.parents or path == src / "commands" / "__init__.py"}
    assert "commands/__init__.py" in found
    assert not {k: v for k, v in found.items() if v}


def test_plan_says_its_guesses_first_and_in_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from vramscope.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "run.py").write_text("from transformers import HfArgumentParser, Trainer\nimport helpers\n")
    cmd = ["python", "run.py", "--model_name_or_path", "Llama-2-7B", "--per_device_train_batch_size", "1",
           "--max_seq_length", "512", "--lora_r", "16"]
    assert main(["plan", "--gpu", "RTX-4090", "--", *cmd]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("ASSUMED: 16-bit base")
    assert "also, if the script loads the model in 4-bit: needs" in out
    assert main(["plan", "--json", "--gpu", "RTX-4090", "--", *cmd]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["assumed"][0].startswith("16-bit base") and data["alternatives"][0]["fits"] in (True, False)
    assert main(["plan", "--json", "--bits", "4", "--gpu", "RTX-4090", "--", *cmd]) == 0
    data = json.loads(capsys.readouterr().out)
    assert not any("bit" in a for a in data["assumed"]) and data["alternatives"] == []  # the flag answered it


def test_a_config_yaml_beside_a_plain_script_and_fsdp_storage(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("from transformers import HfArgumentParser, Trainer\n")
    (tmp_path / "cfg.yaml").write_text("model_name_or_path: Llama-2-70B\nper_device_train_batch_size: 1\n"
                                       "max_seq_length: 2048\nload_in_4bit: true\nlora_r: 16\nfsdp: full_shard\n")
    p = parse("torchrun --nproc_per_node 8 train.py --config cfg.yaml --lora_r 8", tmp_path)
    assert (p.model, p.seq_len, p.spec.bits, p.spec.lora_r) == ("Llama-2-70B", 2048, 4, 8)  # the flag wins
    assert p.config_path is not None and p.config_path.endswith("cfg.yaml")
    assert (p.launch.world_size, p.launch.strategy) == (8, "fsdp")
    assert any("uint8" in u for u in p.unsupported)  # 4-bit under FSDP without bf16 storage
