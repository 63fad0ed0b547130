"""Reading a training command without running it: parse_command over real argv, YAML and JSON files.

The defaults asserted here are the programs' own (TRL 1.16's SFTConfig/ModelConfig, artidoro/qlora's
qlora.py dataclasses, axolotl's schema); where TRL is installed they are checked against its dataclasses.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from vramscope.commands import CommandReadError, ParsedCommand, parse_command

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1024, "max_position_embeddings": 2048}


def parse(cmd: str, cwd: Path, **env: str) -> ParsedCommand:
    return parse_command(shlex.split(cmd), cwd=cwd, environ={"HOME": str(cwd), **env})


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    return d


def test_trl_module_reads_flags_and_applies_trl_defaults(tmp_path: Path, model_dir: Path) -> None:
    p = parse(f"python -m trl.scripts.sft --model_name_or_path {model_dir} --dataset_name data --use_peft "
              "--load_in_4bit --dtype bfloat16 --per_device_train_batch_size 2 --output_dir out --not_a_flag 7",
              tmp_path)
    assert (p.program, p.framework, p.script) == ("trl", "trl", "trl.scripts.sft")
    assert p.model_config is not None and p.model_config["hidden_size"] == 256  # the local config.json
    assert (p.batch_size, p.seq_len, p.grad_accum) == (2, 1024, 1)  # SFTConfig.max_length defaults to 1024
    s = p.spec
    assert (s.bits, s.double_quant, s.quant_type, s.compute_dtype) == (4, False, "nf4", "bf16")
    assert (s.lora_r, s.lora_alpha, s.lora_dropout) == (16, 32, 0.05)  # ModelConfig's LoRA defaults
    assert s.lora_targets == ("q_proj", "v_proj")  # peft's default for llama when target_modules is None
    assert s.gradient_checkpointing is True  # TRL's default, unlike TrainingArguments
    assert (s.optim, s.attn, s.framework) == ("adamw_torch_fused", "sdpa", "trl")
    assert p.read["--per_device_train_batch_size"] == "2" and p.read["--load_in_4bit"] == "true"
    assert "--output_dir" not in p.read and "--dataset_name" not in p.read  # known, no memory effect
    assert p.unknown == ("--not_a_flag 7",)
    assert p.launch.launcher == "python -m" and p.launch.world_size == 1 and p.launch.strategy is None
    assert p.defaults["max_length"] == "1024" and p.defaults["use_bnb_nested_quant"] == "false"


def test_trl_defaults_match_the_installed_trl() -> None:
    trl = pytest.importorskip("trl")
    if not trl.__version__.startswith("1.16"):
        pytest.skip(f"defaults checked against TRL 1.16, found {trl.__version__}")
    from trl import ModelConfig, SFTConfig

    cfg, model = SFTConfig(output_dir="x", use_cpu=True), ModelConfig()
    assert (cfg.max_length, cfg.gradient_checkpointing, cfg.per_device_train_batch_size) == (1024, True, 8)
    assert (model.lora_r, model.lora_alpha, model.lora_dropout, model.lora_target_modules) == (16, 32, 0.05, None)
    assert (model.use_bnb_nested_quant, model.bnb_4bit_quant_type, model.dtype) == (False, "nf4", "float32")
    assert (cfg.optim, cfg.bf16, cfg.gradient_accumulation_steps) == ("adamw_torch_fused", True, 1)
    from transformers import TrainingArguments

    plain = TrainingArguments(output_dir="x", use_cpu=True)  # the generic HF script's defaults
    assert (plain.optim, plain.per_device_train_batch_size, plain.gradient_checkpointing) == (
        "adamw_torch_fused", 8, False)


def test_trl_cli_config_yaml_and_accelerate_flags(tmp_path: Path) -> None:
    (tmp_path / "sft.yaml").write_text(
        "model_name_or_path: Qwen/Qwen2.5-7B\nuse_peft: true\nlora_r: 64\nlora_target_modules: all-linear\n"
        "max_length: 2048\ngradient_checkpointing: false\nbf16: true\nenv:\n  WANDB_MODE: offline\nfancy_key: 1\n")
    p = parse("trl sft --config sft.yaml --max_length 4096 --num_processes 2 --accelerate_config zero3", tmp_path)
    assert p.program == "trl" and p.model == "Qwen/Qwen2.5-7B"
    assert p.seq_len == 4096  # the command line wins over the config file
    assert p.spec.lora_r == 64 and p.spec.lora_targets is None and p.spec.gradient_checkpointing is False
    assert p.read["lora_r (sft.yaml)"] == "64"
    assert "fancy_key (sft.yaml)" in p.unknown
    launch = p.launch
    assert (launch.launcher, launch.world_size, launch.strategy, launch.zero_stage) == ("trl", 2, "zero3", 3)


def test_trl_without_use_peft_is_a_full_fine_tune_and_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandReadError, match="--use_peft"):
        parse("trl sft --model_name_or_path Llama-2-7B", tmp_path)


def test_qlora_py_defaults_and_the_sequence_is_source_plus_target(tmp_path: Path) -> None:
    p = parse("python qlora.py --model_name_or_path huggyllama/llama-7b --bf16 --source_max_len 512 "
              "--target_max_len 512 --per_device_train_batch_size 4 --no_double_quant --lora_r 32", tmp_path)
    # --bf16: qlora.py casts LoRA, embeddings and lm_head back to bf16 after kbit preparation (its own recipe)
    assert (p.program, p.framework, p.spec.framework) == ("qlora", "qlora", "qlora")
    assert (p.batch_size, p.seq_len, p.grad_accum, p.max_steps) == (4, 1024, 16, 10000)
    s = p.spec
    assert (s.bits, s.double_quant, s.lora_r, s.lora_alpha, s.lora_dropout) == (4, False, 32, 16, 0.0)
    assert (s.lora_targets, s.gradient_checkpointing, s.optim) == (None, True, "paged_adamw_32bit")
    assert p.read["--no_double_quant"] == "false"
    q = parse("python qlora.py", tmp_path)
    assert q.model == "EleutherAI/pythia-12b" and q.seq_len == 1024 + 256 and q.batch_size == 1
    assert any("fp32" in n for n in q.notes)  # qlora.py without --bf16 computes in fp32
    assert q.framework == "hf"  # and casts nothing back: the hf recipe


def test_generic_hf_script_with_training_arguments(tmp_path: Path) -> None:
    p = parse("torchrun --nproc_per_node 4 --nnodes 2 train.py --model_name_or_path m --per_device_train_batch_size 4"
              " --gradient_accumulation_steps 8 --block_size 2048 --gradient_checkpointing --optim adamw_bnb_8bit "
              "--load_in_4bit --lora_r 8 --lora_target_modules q_proj v_proj --fsdp 'full_shard offload' --bf16",
              tmp_path)
    assert (p.program, p.framework, p.batch_size, p.grad_accum, p.seq_len) == ("hf", "hf", 4, 8, 2048)
    assert p.seq_flag == "--block_size"
    s = p.spec
    assert (s.bits, s.lora_r, s.lora_targets, s.gradient_checkpointing, s.optim) == (
        4, 8, ("q_proj", "v_proj"), True, "adamw_8bit")
    launch = p.launch
    assert (launch.launcher, launch.world_size, launch.nodes, launch.strategy, launch.offload) == (
        "torchrun", 8, 2, "fsdp", True)


def test_deepspeed_launcher_and_ds_json(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(
        {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": "auto"}}))
    p = parse("deepspeed --num_gpus 2 train.py --model_name_or_path m --per_device_train_batch_size 1 "
              "--max_seq_length 512 --deepspeed ds.json", tmp_path)
    assert (p.launch.launcher, p.launch.world_size, p.launch.strategy, p.launch.offload) == (
        "deepspeed", 2, "zero3", True)
    assert p.launch.config_file == "ds.json"


def test_accelerate_config_file_fsdp_and_deepspeed(tmp_path: Path) -> None:
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n"
                                        "  fsdp_offload_params: true\n")
    cmd = "--per_device_train_batch_size 2 --max_length 512 --model_name_or_path m"
    p = parse(f"accelerate launch --config_file fsdp.yaml train.py {cmd}", tmp_path)
    assert (p.launch.launcher, p.launch.world_size, p.launch.strategy, p.launch.offload) == (
        "accelerate", 4, "fsdp", True)
    (tmp_path / "ds.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n"
                                      "  zero_stage: 2\n  offload_optimizer_device: none\n")
    p = parse(f"accelerate launch --config_file ds.yaml --num_processes 2 train.py {cmd}", tmp_path)
    assert (p.launch.world_size, p.launch.strategy, p.launch.offload) == (2, "zero2", False)  # flag wins
    (tmp_path / "ddp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    assert parse(f"accelerate launch --config_file ddp.yaml train.py {cmd}", tmp_path).launch.strategy == "ddp"
    p = parse(f"accelerate launch train.py {cmd}", tmp_path)  # no config anywhere: every visible GPU
    assert p.launch.world_size is None and any("visible GPU" in n for n in p.notes)
    p = parse(f"CUDA_VISIBLE_DEVICES=0,1 uv run python -m torch.distributed.run --nproc-per-node=2 train.py {cmd}",
              tmp_path)
    assert (p.launch.launcher, p.launch.world_size, p.launch.strategy) == ("torchrun", 2, "ddp")


def test_axolotl_yaml_keys_defaults_and_cli_overrides(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "qlora.yml").write_text(
        f"base_model: {model_dir}\nadapter: qlora\nload_in_4bit: true\nmicro_batch_size: 2\n"
        "gradient_accumulation_steps: 4\nsequence_len: 4096\nlora_r: 32\nlora_alpha: 16\nlora_dropout: 0.05\n"
        "lora_target_linear: true\ngradient_checkpointing: true\noptimizer: paged_adamw_8bit\nbf16: auto\n"
        "flash_attention: true\nsample_packing: true\ndatasets:\n  - path: data.jsonl\n    type: alpaca\n"
        "output_dir: ./out\nodd_key: 3\n")
    p = parse("accelerate launch -m axolotl.cli.train qlora.yml --micro_batch_size 3", tmp_path)
    assert (p.program, p.framework, p.script) == ("axolotl", "hf", "axolotl.cli.train")
    assert (p.batch_size, p.grad_accum, p.seq_len) == (3, 4, 4096)
    s = p.spec
    assert (s.bits, s.double_quant, s.lora_r, s.lora_alpha, s.lora_targets) == (4, True, 32, 16, None)
    assert (s.gradient_checkpointing, s.optim, s.attn, s.compute_dtype) == (
        True, "paged_adamw_8bit", "flash_attention_2", "bf16")
    assert p.batch_flag == "micro_batch_size" and p.seq_flag == "sequence_len"
    assert p.config_path is not None and p.config_path.endswith("qlora.yml")
    assert "odd_key (qlora.yml)" in p.unknown
    (tmp_path / "small.yml").write_text("base_model: Llama-2-7B\nadapter: lora\n")
    q = parse("axolotl train small.yml", tmp_path)
    assert (q.batch_size, q.seq_len, q.spec.gradient_checkpointing, q.spec.optim, q.spec.bits) == (
        1, 512, False, "adamw_torch_fused", 16)  # axolotl's schema defaults
    assert q.spec.lora_targets == ("q_proj", "v_proj")  # the registry's llama: peft's default targets


@pytest.mark.parametrize(("cmd", "needle"), [
    ("bash train.sh", "vramscope reads python, accelerate launch, torchrun"),
    ("srun python train.py", "cannot read the model and shapes"),
    ("python train.py --steps 30 --batch-size 4", "cannot read the model and shapes"),
    ("python -c 'print(1)'", "python -c"),
    ("trl vllm-serve --model m", "trl sft|dpo|grpo"),
    ("axolotl train", "config file"),
    ("accelerate config", "accelerate launch"),
    ("python -m trl.scripts.sft --model_name_or_path m --use_peft --per_device_train_batch_size four", "not a number"),
    ("python -m trl.scripts.sft --model_name_or_path ./missing --use_peft", "not found"),
])
def test_commands_vramscope_cannot_read_say_how_to_plan_instead(tmp_path: Path, cmd: str, needle: str) -> None:
    with pytest.raises(CommandReadError, match=needle) as info:
        parse(cmd, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    if "cannot read" in message or "vramscope reads" in message:
        assert "--batch-size" in message and "--seq-len" in message


def test_config_files_that_do_not_parse(tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text("base_model: [unclosed\n")
    with pytest.raises(CommandReadError, match=r"not valid YAML .*line"):
        parse("axolotl train bad.yml", tmp_path)
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    with pytest.raises(CommandReadError, match="mapping"):
        parse("axolotl train list.yml", tmp_path)
    (tmp_path / "ds.json").write_text("{not json")
    with pytest.raises(CommandReadError, match="not valid JSON"):
        parse("python train.py --model_name_or_path m --deepspeed ds.json", tmp_path)
    with pytest.raises(CommandReadError, match="not found"):
        parse("accelerate launch --config_file nope.yaml train.py --model_name_or_path m", tmp_path)


def test_a_local_model_directory_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommandReadError, match=r"has no config\.json"):
        parse("python -m trl.scripts.sft --use_peft --model_name_or_path empty", tmp_path)


def test_an_hf_script_is_recognised_by_its_source(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("from transformers import HfArgumentParser\n")
    p = parse("python train.py --output_dir out", tmp_path)  # no memory flags, but an HfArgumentParser script
    assert p.program == "hf" and p.model is None and p.batch_size == 8  # TrainingArguments' default
    (tmp_path / "sft_copy.py").write_text("from trl import ModelConfig, SFTConfig, TrlParser\n")
    assert parse("python sft_copy.py --use_peft --model_name_or_path m", tmp_path).program == "trl"


def test_parsed_command_to_dict_is_json(tmp_path: Path, model_dir: Path) -> None:
    p = parse(f"python -m trl.scripts.sft --model_name_or_path {model_dir} --use_peft", tmp_path)
    out = json.loads(json.dumps(p.to_dict()))
    assert out["launch"] == {"launcher": "python -m", "world_size": 1, "strategy": None, "offload": False,
                             "zero_stage": None, "config_file": None, "nodes": 1, "fsdp_version": None}
    assert out["model_from"] == "directory" and out["spec"]["framework"] == "trl"


def test_the_setting_to_print_is_in_the_commands_own_spelling(tmp_path: Path) -> None:
    from vramscope.tune.command import setting_for

    (tmp_path / "ax.yml").write_text("base_model: Llama-2-7B\nadapter: lora\n")
    axolotl = parse("axolotl train ax.yml", tmp_path)
    assert setting_for(axolotl, "batch", 6) == "micro_batch_size: 6 (in ax.yml)"
    assert setting_for(axolotl, "seq_len", 3072) == "sequence_len: 3072 (in ax.yml)"
    trl = parse("trl sft --model_name_or_path m --use_peft", tmp_path)
    assert setting_for(trl, "batch", 6) == "--per_device_train_batch_size 6"
    assert setting_for(trl, "seq_len", 3072) == "--max_length 3072"
    qlora = parse("python qlora.py", tmp_path)
    assert setting_for(qlora, "seq_len", 2048) == "--source_max_len and --target_max_len summing to 2048"
    hf = parse("python train.py --model_name_or_path m --per_device_train_batch_size 2 --block_size 512", tmp_path)
    assert setting_for(hf, "seq_len", 1024) == "--block_size 1024"
