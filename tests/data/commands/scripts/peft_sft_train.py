# Written for vramscope's tests (not copied): a script with the same arguments and dataclass defaults as PEFT's
# examples/sft/train.py (huggingface/peft @ 5d602fdbff04c33c1c4de55cda9d4ae1d7cb7e40), so that a command pasted
# for that script is read as it would be: HfArgumentParser over two dataclasses and TRL's SFTConfig, a
# BitsAndBytesConfig and a LoraConfig built from the flags, and TRL's SFTTrainer. It is read, never run.
from dataclasses import dataclass, field

from peft import LoraConfig
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, HfArgumentParser
from trl import SFTConfig, SFTTrainer


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default=None)
    lora_alpha: int = field(default=16)
    lora_dropout: float = field(default=0.1)
    lora_r: int = field(default=64)
    lora_target_modules: str = field(default="q_proj,k_proj,v_proj,o_proj,down_proj,up_proj,gate_proj")
    use_nested_quant: bool = field(default=False)
    bnb_4bit_compute_dtype: str = field(default="float16")
    bnb_4bit_quant_storage_dtype: str = field(default="uint8")
    bnb_4bit_quant_type: str = field(default="nf4")
    use_flash_attn: bool = field(default=False)
    use_peft_lora: bool = field(default=False)
    use_8bit_quantization: bool = field(default=False)
    use_4bit_quantization: bool = field(default=False)
    use_reentrant: bool = field(default=False)
    use_unsloth: bool = field(default=False)


@dataclass
class DataTrainingArguments:
    dataset_name: str = field(default="timdettmers/openassistant-guanaco")
    chat_template_format: str = field(default="none")
    append_concat_token: bool = field(default=False)
    add_special_tokens: bool = field(default=False)
    splits: str = field(default="train,test")


def main(model_args, data_args, training_args):
    quantization = BitsAndBytesConfig(load_in_4bit=model_args.use_4bit_quantization,
                                      load_in_8bit=model_args.use_8bit_quantization,
                                      bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
                                      bnb_4bit_use_double_quant=model_args.use_nested_quant)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, quantization_config=quantization)
    peft_config = LoraConfig(r=model_args.lora_r, lora_alpha=model_args.lora_alpha,
                             target_modules=model_args.lora_target_modules.split(","))
    SFTTrainer(model=model, args=training_args, peft_config=peft_config).train()


if __name__ == "__main__":
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, SFTConfig))
    main(*parser.parse_args_into_dataclasses())
