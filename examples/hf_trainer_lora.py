"""A LoRA fine-tune driven by ``HfArgumentParser``: the shape of most HF Trainer scripts (and of qlora.py).

Every flag of ``TrainingArguments`` works, plus the few below. ``vramscope plan -- python
examples/hf_trainer_lora.py ...`` reads them without running anything, and ``vramscope tune -- python
examples/hf_trainer_lora.py ...`` runs short trials of this very script on the GPU::

    python examples/hf_trainer_lora.py --model_name_or_path ./tiny-llama --output_dir out \\
        --per_device_train_batch_size 4 --max_seq_length 256 --max_steps 20 --bf16 --gradient_checkpointing

The data are random token rows of varying length (memory depends on shapes, not on text), so the script
needs only a model folder (``--write_random_model`` makes a tiny random Llama there first). With
``--load_in_4bit`` on a CUDA GPU the base is NF4 through bitsandbytes (QLoRA).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "a model folder (config.json and weights)"})
    max_seq_length: int = field(default=128, metadata={"help": "the longest row of the data"})
    lora_r: int = field(default=16)
    lora_alpha: int = field(default=32)
    load_in_4bit: bool = field(default=False, metadata={"help": "NF4 base weights (CUDA only)"})
    rows: int = field(default=64, metadata={"help": "rows in the random dataset"})
    write_random_model: bool = field(default=False, metadata={"help": "first save a tiny random Llama there"})


class RandomRows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, count: int, vocab: int, longest: int) -> None:
        gen = torch.Generator().manual_seed(0)
        lengths = torch.randint(max(2, longest // 2), longest + 1, (count,), generator=gen)
        self.rows = [torch.randint(0, vocab, (int(n),), generator=gen) for n in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i]}


def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    longest = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, item in enumerate(batch):
        ids[row, : len(item["input_ids"])] = item["input_ids"]
        mask[row, : len(item["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main() -> None:
    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if model_args.write_random_model:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                             num_key_value_heads=4, vocab_size=8192, max_position_embeddings=4096)
        LlamaForCausalLM(config).save_pretrained(model_args.model_name_or_path)
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda and training_args.bf16 else torch.float32
    kwargs: dict[str, object] = {"dtype": dtype}
    if model_args.load_in_4bit and cuda:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_use_double_quant=True,
                                                           bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    if model_args.load_in_4bit and cuda:
        model = prepare_model_for_kbit_training(model, training_args.gradient_checkpointing)
    model = get_peft_model(model, LoraConfig(r=model_args.lora_r, lora_alpha=model_args.lora_alpha,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    data = RandomRows(model_args.rows, model.config.vocab_size, model_args.max_seq_length)
    trainer = Trainer(model=model, args=training_args, train_dataset=data, data_collator=collate)
    result = trainer.train()
    trainer.save_model(training_args.output_dir)
    Path(training_args.output_dir, "finished.txt").write_text(f"{result.global_step}\n", encoding="utf-8")
    print(f"trained {result.global_step} steps, final loss {result.training_loss:.3f}")


if __name__ == "__main__":
    main()
