"""A framework is one module in ``planner/frameworks/`` and its line in the registry's table: everything else
(the memory model, ``--framework`` and ``--settings-style``, the advice's keys, the trace, the real builders of
``tune`` and ``plan --calibrate``) reads the table. Two checks hold that: a framework registered at run time is
picked up by each of them, and no module outside the package compares a framework's name with a string."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from name_checks import string_checks
from vramscope.cli import main
from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import (
    FRAMEWORK_TABLE,
    FRAMEWORKS,
    STYLE_TABLE,
    STYLES,
    Build,
    Style,
    framework_for,
    register,
    registered,
    traced,
)
from vramscope.planner.frameworks.registry import TRL_TRAINERS, framework_of_program
from vramscope.planner.phases import RunPhases, plan_run
from vramscope.planner.registry import get_config
from vramscope.planner.settings import style_of, written_as
from vramscope.planner.shapes import shape_from_config
from vramscope.recipe import QLoraSpec
from vramscope.units import MIB

SRC = Path(__file__).resolve().parent.parent / "src" / "vramscope"
PACKAGE = SRC / "planner" / "frameworks"

# A hand-written loop that keeps only its loss, as loop-loss, on a stack whose CUDA context is larger, with
# settings of its own (a config dataclass with a length field).
MINE_STYLE = Style(name="mine", config="MyLoopConfig", length_field=True)
MINE = replace(FRAMEWORK_TABLE["loop-loss"], name="my-loop", title="my own loop keeping only the loss",
               cuda_context_bytes=1000 * MIB, build=Build(peft_kbit=True, trainer=False, traced=True),
               style=MINE_STYLE.name, summary="my own loop", switch_to=None)
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384, "max_position_embeddings": 256}


def _plan_json(capsys: pytest.CaptureFixture[str], framework: str) -> dict[str, object]:
    code = main(["plan", "--model", "Llama-2-7B", "--batch-size", "2", "--seq-len", "512", "--gpu", "RTX-4090",
                 "--framework", framework, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return dict(json.loads(out))


def test_the_built_in_frameworks_are_the_table() -> None:
    assert tuple(FRAMEWORKS) == ("hf", "trl", "qlora", "unsloth", "loop", "loop-loss")
    assert tuple(STYLES) == ("hf", "trl", "qlora", "loop", "axolotl")
    assert traced() == ("hf", "trl", "loop", "loop-loss")
    assert all(FRAMEWORK_TABLE[name].name == name for name in FRAMEWORKS)


def test_a_registered_framework_is_planned_from_its_own_record(capsys: pytest.CaptureFixture[str]) -> None:
    with registered(MINE, MINE_STYLE):
        assert "my-loop" in FRAMEWORKS and "mine" in STYLES and "my-loop" in traced()
        ours = _plan_json(capsys, "my-loop")
        base = _plan_json(capsys, "loop-loss")
        # the same step as loop-loss but for its larger CUDA context, and the advice in its own keys
        assert ours["framework"] == "my-loop" and ours["framework_title"] == MINE.title
        assert ours["peak_allocated_bytes"] == base["peak_allocated_bytes"]
        assert ours["process_bytes"] == base["process_bytes"] + (1000 - 745) * MIB  # type: ignore[operator]
        hows = [r["how"] for r in ours["recommendations"]]  # type: ignore[attr-defined]
        assert any(h.startswith("MyLoopConfig(") for h in hows), hows
        assert written_as({"batch_size": 2, "seq_len": 256}, "mine") == (
            "MyLoopConfig(per_device_train_batch_size=2, max_length=256)")
        assert style_of(None, "my-loop") == "mine" and style_of("axolotl", "my-loop") == "axolotl"
    assert "my-loop" not in FRAMEWORKS and "mine" not in STYLES  # the table as before


def test_a_registered_framework_is_a_choice_of_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with registered(MINE, MINE_STYLE):
        with pytest.raises(SystemExit):
            main(["plan", "--help"])
        assert "my-loop (my own loop)" in capsys.readouterr().out
        with pytest.raises(SystemExit):
            main(["report", "--help"])
        assert "mine" in capsys.readouterr().out  # --settings-style's choices
    code = main(["plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "64", "--framework", "my-loop"])
    assert code == 2 and "my-loop" in capsys.readouterr().err


@pytest.mark.slow
def test_a_registered_framework_is_traced_and_built_as_its_build_says(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from vramscope.planner.trace.engine import trace_plan
    from vramscope.tune.qlora import build_trainer, write_random_checkpoint

    spec = QLoraSpec(bits=16, lora_r=4, optim="adamw_torch", gradient_checkpointing=False)
    with registered(MINE, MINE_STYLE):
        ours = trace_plan(TINY, 2, 32, spec.with_(framework="my-loop"))
        base = trace_plan(TINY, 2, 32, spec.with_(framework="loop-loss"))
        assert ours.traced_peak_bytes == base.traced_peak_bytes > 0 and ours.phases == base.phases
        assert ours.process_bytes - base.process_bytes == (1000 - 745) * MIB
        # the real step (tune, plan --calibrate): no autocast on a loop, the output dropped after the loss
        trainer = build_trainer(write_random_checkpoint(TINY, tmp_path / "tiny", dtype="fp32"),
                                spec.with_(framework="my-loop"), device="cpu")
        trainer.step(2, 16)
        assert trainer._kept is None


def test_the_table_refuses_a_framework_naming_what_it_has_not() -> None:
    with pytest.raises(ValueError, match="style 'nowhere'"):
        register(replace(MINE, style="nowhere"))
    with pytest.raises(ValueError, match="switch_to 'nothing'"):
        register(replace(MINE, switch_to="nothing"), MINE_STYLE)
    STYLE_TABLE.pop(MINE_STYLE.name)
    with pytest.raises(ValueError, match="registered already"):
        register(FRAMEWORK_TABLE["hf"])
    assert "my-loop" not in FRAMEWORKS and "mine" not in STYLES
    assert framework_for(QLoraSpec()).name == "hf"


def test_a_framework_planned_in_one_dtype_refuses_the_others_in_its_own_words(
        capsys: pytest.CaptureFixture[str]) -> None:
    # qlora.py's refusal is its module's field, not the memory model's text: a registered framework with a dtype of
    # its own is refused in its own words, and the default words name it and the dtype
    argv = ["plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512", "--gpu", "RTX-4090",
            "--framework", "my-loop", "--compute-dtype", "fp16"]
    for refusal, said in ((replace(MINE, compute_dtype_only="bf16"),
                           "framework my-loop is planned in --compute-dtype bf16 only, not fp16"),
                          (replace(MINE, compute_dtype_only="bf16", other_dtype_refusal="{name}: {only}, not {dtype}"),
                           "my-loop: bf16, not fp16")):
        with registered(refusal, MINE_STYLE):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert said in err and len(err.strip().splitlines()) == 1, err
            assert main([*argv[:-1], "bf16"]) == 0
            capsys.readouterr()
    assert FRAMEWORK_TABLE["qlora"].compute_dtype_only == "bf16"


def test_each_framework_names_command_readers_that_exist() -> None:
    from vramscope.commands.dispatch import PROGRAMS

    named = {p for fw in FRAMEWORK_TABLE.values() for p in fw.programs}
    named |= {p for style in STYLE_TABLE.values() for p in style.programs}
    assert named and named <= set(PROGRAMS), named - set(PROGRAMS)


def test_every_program_plans_with_the_one_framework_that_names_it(tmp_path: Path) -> None:
    from vramscope.commands import parse_command
    from vramscope.commands.dispatch import PROGRAMS

    owners = {p: [fw.name for fw in FRAMEWORK_TABLE.values() if p in fw.programs] for p in PROGRAMS}
    assert all(len(names) == 1 for names in owners.values()), owners
    assert {p: framework_of_program(p).name for p in PROGRAMS} == {p: n[0] for p, n in owners.items()}
    with pytest.raises(ValueError, match="plans with 'hf' already"):
        register(replace(MINE, programs=("axolotl",)), MINE_STYLE)
    assert "my-loop" not in FRAMEWORKS
    STYLE_TABLE.pop(MINE_STYLE.name)
    # A reading takes its program's framework from the table: a framework that names axolotl (in the table's
    # place of hf) is what an axolotl command plans with, with no line in the reader.
    (tmp_path / "ax.yml").write_text("base_model: NousResearch/Llama-2-7b-hf\nadapter: qlora\nload_in_4bit: true\n")
    argv = ["axolotl", "train", "ax.yml"]
    parsed = parse_command(argv, cwd=tmp_path)
    assert parsed.framework == "hf" and "planned as the hf framework" in " ".join(parsed.notes)
    hf = FRAMEWORK_TABLE["hf"]
    FRAMEWORK_TABLE["hf"] = replace(hf, programs=tuple(p for p in hf.programs if p != "axolotl"))
    try:
        with registered(replace(MINE, programs=("axolotl",)), MINE_STYLE):
            parsed = parse_command(argv, cwd=tmp_path)
            assert parsed.framework == parsed.spec.framework == "my-loop"
            # the reader's note says the framework the table gave, not the one it was written for
            notes = " ".join(parsed.notes)
            assert "planned as the my-loop framework" in notes and "the hf framework" not in notes, notes
    finally:
        FRAMEWORK_TABLE["hf"] = hf
    with pytest.raises(PlanInputError, match="no framework names the program 'nobody'"):
        framework_of_program("nobody")


def test_a_reader_overrides_the_framework_only_where_the_command_says_more(tmp_path: Path) -> None:
    from vramscope.commands import parse_command

    model = "--model_name_or_path NousResearch/Llama-2-7b-hf"
    qlora = ["python", "qlora.py", *model.split()]
    assert parse_command(qlora, cwd=tmp_path).framework == framework_of_program("qlora").name == "hf"
    assert parse_command([*qlora, "--bf16"], cwd=tmp_path).framework == "qlora"  # cast back to bf16
    unsloth = ["python", "unsloth-cli.py", "--model_name", "unsloth/llama-3-8b", "--use_gradient_checkpointing"]
    assert parse_command([*unsloth, "True"], cwd=tmp_path).framework == framework_of_program("unsloth").name == "trl"
    assert parse_command([*unsloth, "unsloth"], cwd=tmp_path).framework == "unsloth"  # checkpoints on the host
    (tmp_path / "train.py").write_text("from transformers import HfArgumentParser, TrainingArguments\n"
                                       "from trl import SFTTrainer\nparser = HfArgumentParser((TrainingArguments,))\n"
                                       "SFTTrainer(model='m')\n")
    hf = ["python", "train.py", *model.split(), "--per_device_train_batch_size", "2"]
    assert framework_of_program("hf").name == "hf"
    assert parse_command(hf, cwd=tmp_path).framework == "trl"  # the script builds TRL's trainer


# -- no framework name compared with a string outside the package ----------------------------------------------

def _names_a_framework(node: ast.expr) -> bool:
    """``spec.framework``, ``args.framework``, ``framework``, ``framework_name``, ``fw.name``, ``framework.name``,
    or a call of one (``runs_as(spec.framework)``)."""
    if isinstance(node, ast.Call):
        return any(_names_a_framework(a) for a in node.args)
    if isinstance(node, ast.Attribute):
        if "framework" in node.attr:
            return True
        return node.attr == "name" and isinstance(node.value, ast.Name) and node.value.id in ("fw", "framework")
    return isinstance(node, ast.Name) and "framework" in node.id


def framework_string_checks(source: str) -> list[str]:
    """Each place in ``source`` that compares a framework's name with a string literal (:mod:`name_checks`)."""
    return string_checks(ast.parse(source), _names_a_framework)


def test_the_scan_sees_the_checks_that_were_there() -> None:
    # what api.py, trace/engine.py, tune/qlora.py and dataset/lengths.py held before the table
    for check in ('spec.framework == "trl"', 'fw.name not in ("trl", "unsloth")', 'spec.framework.startswith("loop")',
                  '{"qlora": "hf", "unsloth": "trl"}.get(framework, framework)', 'framework in ("hf", "trl")',
                  '{"trl": "sft"}[spec.framework]', 'runs_as(spec.framework) == "trl"',
                  'RUNS_AS = {"qlora": "hf"}\ndef runs_as(framework):\n    return RUNS_AS.get(framework, framework)'):
        assert framework_string_checks(check), check
    for fine in ('parsed.program == "axolotl"', 'fw.logits == "chunked"', 'framework_named(args.framework).style',
                 'spec.framework != TRL_TRAINERS.name', 'trainer in ("sft", "hf")',
                 'PROGRAMS = {"trl": 1}\nPROGRAMS[parsed.program]'):
        assert not framework_string_checks(fine), fine


def test_no_module_outside_the_frameworks_compares_a_framework_name_with_a_string() -> None:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if PACKAGE in path.parents:
            continue
        checks = framework_string_checks(path.read_text(encoding="utf-8"))
        if checks:
            found[str(path.relative_to(SRC))] = checks
    assert not found, f"framework names compared with strings (read an attribute of the framework instead): {found}"


@pytest.mark.parametrize("run", [RunPhases(), RunPhases(eval_batch=2), RunPhases(trainer="dpo"),
                                 RunPhases(trainer="grpo", eval_batch=2)])
def test_every_phase_refuses_a_framework_the_table_does_not_have(run: RunPhases) -> None:
    # planner/phases.py read FRAMEWORK_TABLE["hf"] for a name it did not know: the run was planned as hf in silence
    shape = shape_from_config(get_config("Llama-2-7B"))
    with pytest.raises(PlanInputError) as refused:
        plan_run(shape, QLoraSpec(framework="my-unregistered-loop"), 8, 256, run=run)
    assert str(refused.value) == f"unknown framework 'my-unregistered-loop'; choose one of {', '.join(FRAMEWORKS)}"


def test_the_trl_trainers_plan_with_the_registrys_trl_framework() -> None:
    # DPO's step is TRL's whatever framework the recipe names: the same as naming trl outright
    shape = shape_from_config(get_config("Llama-2-7B"))
    dpo = RunPhases(trainer="dpo")
    as_hf = plan_run(shape, QLoraSpec(framework="hf"), 1, 256, run=dpo)
    as_trl = plan_run(shape, QLoraSpec(framework=TRL_TRAINERS.name), 1, 256, run=dpo)
    assert as_hf.phases["train"] == as_trl.phases["train"]
