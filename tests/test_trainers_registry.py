"""A trainer is one row of ``vramscope/trainers.TRAINERS``: the planner's phases and advice, ``plan --trainer``'s
choices and help, a pasted command's kind and ``plan --dataset``'s reading all read its fields. Two checks hold
that: a trainer added to the table at run time (ORPO, which the built-in table plans as DPO with the reference
precomputed) is planned, listed and read from commands and data as its row says, nothing else touched; and no
module outside the table's compares a trainer's name with a string."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from name_checks import string_checks
from vramscope.cli import main
from vramscope.commands.types import TRAINER_KINDS
from vramscope.planner.frameworks import FRAMEWORK_TABLE
from vramscope.planner.phases import RunPhases, plan_run
from vramscope.planner.registry import get_config
from vramscope.planner.shapes import shape_from_config
from vramscope.recipe import QLoraSpec
from vramscope.trainers import (
    DEFAULT_TRAINER,
    TOKENIZATIONS,
    TRAINERS,
    Trainer,
    reading_trainer,
    registered,
    trainer_of_kind,
)

SRC = Path(__file__).resolve().parent.parent / "src" / "vramscope"
TABLE = SRC / "trainers.py"

# ORPO as a row of its own: chosen and rejected in one forward of 2b rows, no reference model, its own config;
# it reads DPO's pairs, and takes the command kind "orpo" from the DPO row.
ORPO = Trainer("orpo", rows_per_example=2, config="ORPOConfig", dataset="dpo", label="TRL ORPO",
               step_note="ORPO: chosen and rejected in one forward of {rows} rows x {seq} tokens, no reference model",
               kinds=("orpo",))
DPO_ALONE = replace(TRAINERS["dpo"], kinds=("dpo",), kinds_without_reference=())
BASE = ["plan", "--model", "Llama-3-8B", "--batch-size", "4", "--seq-len", "1024", "--gpu-memory", "24GiB"]
ORPO_COMMAND = ["trl", "orpo", "--model_name_or_path", "NousResearch/Llama-2-7b-hf", "--per_device_train_batch_size",
                "2", "--max_length", "512", "--load_in_4bit", "--use_peft"]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    result: dict[str, Any] = json.loads(out.out)
    return result


def test_the_built_in_trainers_are_the_table() -> None:
    assert tuple(TRAINERS) == ("sft", "dpo", "grpo", "reward", "kto") and DEFAULT_TRAINER in TRAINERS
    assert tuple(TOKENIZATIONS) == ("sft", "hf", "dpo", "grpo")
    assert all(TRAINERS[n].name == n for n in TRAINERS) and all(TOKENIZATIONS[n].name == n for n in TOKENIZATIONS)
    assert {fw.dataset_trainer for fw in FRAMEWORK_TABLE.values()} <= set(TOKENIZATIONS)
    # every kind a command reader gives is a row's, but PPO (planned as the default, a supervised step)
    planned = {kind for t in TRAINERS.values() for kind in t.kinds}
    assert planned <= set(TRAINER_KINDS) and set(TRAINER_KINDS) - planned == {"ppo"}
    assert trainer_of_kind("ppo").name == DEFAULT_TRAINER and trainer_of_kind("orpo").name == "dpo"
    assert reading_trainer("dpo") is TRAINERS["dpo"] and reading_trainer("sft") is None


def test_a_trainer_added_to_the_table_is_planned_from_its_row(capsys: pytest.CaptureFixture[str]) -> None:
    shape = shape_from_config(get_config("Llama-3-8B"))
    with registered(ORPO, DPO_ALONE):
        out = _json(capsys, *BASE, "--trainer", "orpo", "--eval-batch", "16", "--eval-logits", "kept", "--json")
        assert out["trainer"] == "orpo" and list(out["phases"]) == ["load", "train", "eval"]
        train = out["phases"]["train"]
        assert train["rows"] == 8 and "reference forward" not in train["moments"]
        assert train["notes"] == [ORPO.step_note.format(rows=8, seq=1024)]
        assert train["notes"][0].startswith("ORPO: chosen and rejected in one forward of 8 rows x 1024 tokens")
        assert out["phases"]["eval"]["rows"] == 32  # 16 pairs
        assert "trainer orpo is TRL's: planned with TRL's dtypes and fused LM head" in out["notes"]
        hows = [r["how"] for r in out["recommendations"]]
        assert "ORPOConfig(per_device_eval_batch_size=8)" in hows, hows
        texts = [r["text"] for r in out["recommendations"]]
        assert any(t.startswith("evaluate 8 pairs at a time") for t in texts), texts
        # its step is DPO's with the reference precomputed: 2b rows through TRL's head, no reference forward
        orpo = plan_run(shape, QLoraSpec(framework="trl"), 4, 1024, run=RunPhases(trainer="orpo"))
        dpo = plan_run(shape, QLoraSpec(framework="trl"), 4, 1024, run=RunPhases(trainer="dpo", precompute_ref=True))
        assert orpo.phases["train"].moments == dpo.phases["train"].moments
        assert "precompute_ref" not in orpo.phases and "precompute_ref" in dpo.phases
    assert tuple(TRAINERS) == ("sft", "dpo", "grpo", "reward", "kto") and TRAINERS["dpo"].kinds == ("dpo", "orpo")


def test_a_trainer_added_to_the_table_is_listed_where_the_trainers_are(capsys: pytest.CaptureFixture[str]) -> None:
    with registered(ORPO, DPO_ALONE):
        with pytest.raises(SystemExit):
            main(["plan", "--help"])
        listed = " ".join(capsys.readouterr().out.split())
        assert "--trainer {sft,dpo,grpo,reward,kto,orpo}" in listed
        assert "the trainer: sft (default), dpo, grpo (no vLLM), reward, kto, orpo; the last five are TRL's" in listed
        # a flag of another trainer's names the trainers it belongs to
        assert main([*BASE, "--trainer", "orpo", "--precompute-ref"]) == 2
        assert "--precompute-ref is a DPO/KTO setting: add --trainer dpo or --trainer kto" in capsys.readouterr().err
    assert main([*BASE, "--trainer", "orpo"]) == 2  # gone with its row
    assert "invalid choice: 'orpo'" in capsys.readouterr().err


def test_a_command_of_the_kind_a_row_names_plans_as_that_row(capsys: pytest.CaptureFixture[str]) -> None:
    before = _json(capsys, "plan", "--json", "--gpu", "RTX-4090", "--", *ORPO_COMMAND)
    assert (before["trainer"], before["run"]["precompute_ref"]) == ("dpo", True)  # the built-in table's stand-in
    with registered(ORPO, DPO_ALONE):
        out = _json(capsys, "plan", "--json", "--gpu", "RTX-4090", "--", *ORPO_COMMAND)
        assert (out["trainer"], out["run"]["precompute_ref"]) == ("orpo", False)
        assert out["phases"]["train"]["rows"] == 4 and list(out["phases"]) == ["load", "train"]


def test_a_trainer_added_to_the_table_reads_its_data_as_its_row_says(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt_ids": list(range(n)), "chosen_ids": list(range(n // 2)),
                                         "rejected_ids": list(range(n // 3))}) + "\n" for n in (5, 40, 300, 17)))
    with registered(ORPO, DPO_ALONE):
        out = _json(capsys, *BASE, "--trainer", "orpo", "--dataset", str(pairs), "--json")
    data = out["dataset"]
    assert data["trainer"] == "dpo" and data["how"].startswith("TRL ORPO; prompt_ids + chosen_ids / rejected_ids")
    # the longest batch is 4 pairs stacked as 8 rows; the plan takes the pairs and stacks them itself
    assert (data["peak_batch_rows"], out["batch_size"], out["phases"]["train"]["rows"]) == (8, 4, 8)


def test_the_table_refuses_a_row_naming_what_it_has_not() -> None:
    with pytest.raises(ValueError, match="'orpo', which 'dpo' plans already"), registered(ORPO):
        pass
    with pytest.raises(ValueError, match="reads its data as 'nowhere'"), registered(replace(ORPO, dataset="nowhere")):
        pass
    with pytest.raises(ValueError, match="kinds_without_reference"), registered(
            replace(ORPO, kinds_without_reference=("simpo",)), DPO_ALONE):
        pass
    assert "orpo" not in TRAINERS and TRAINERS["dpo"].kinds == ("dpo", "orpo")  # the table as before


# -- no trainer name compared with a string outside the table ---------------------------------------------------

def _names_a_trainer(node: ast.expr, aliases: set[str]) -> bool:
    """``run.trainer``, ``data.trainer``, ``trainer``, ``run_trainer``, ``fields["trainer"]``, a local bound to one
    (``t = run.trainer``), or one of them in ``or`` (``run_trainer or ""``). A call's arguments are not read: the
    trainers of Lightning and the HF Trainer are objects, not names."""
    if isinstance(node, ast.BoolOp):
        return any(_names_a_trainer(v, aliases) for v in node.values)
    if isinstance(node, ast.Attribute):
        return "trainer" in node.attr
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "trainer"
    return isinstance(node, ast.Name) and ("trainer" in node.id or node.id in aliases)


def trainer_string_checks(source: str) -> list[str]:
    """Each place in ``source`` that compares a trainer's name with a string literal (:mod:`name_checks`)."""
    tree = ast.parse(source)
    aliases: set[str] = set()  # bound to a trainer's name itself; not to a default (kind = ... or "sft")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and not isinstance(node.value, ast.BoolOp)
                and _names_a_trainer(node.value, set())):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return string_checks(tree, lambda node: _names_a_trainer(node, aliases), membership_left_only=True)


def test_the_scan_sees_the_checks_that_were_there() -> None:
    # what planner/phases.py, api.py, phase_advice.py, settings.py, cli/plan*.py, commands/phases.py and dataset/
    # held before the table
    for check in ('run.trainer == "sft"', 'run.trainer in ("dpo", "reward")', 'data.trainer == "grpo"',
                  'trainer in (None, "dpo", "reward")', 'layout.trainer != "grpo"', 'fields["trainer"] == "grpo"',
                  't = run.trainer\nif t == "reward":\n    pass',
                  '{"dpo": "dpo", "grpo": "grpo"}.get(run_trainer or "")',
                  '{"sft": "TRL SFT", "hf": "HF Trainer"}[layout.trainer]', 'run_trainer.startswith("TRL")',
                  'TRAINER_CONFIGS = {"dpo": "DPOConfig"}\nTRAINER_CONFIGS.get(run_trainer, "SFTConfig")',
                  '_CONFIG = {"sft": "TrainingArguments"}\n_CONFIG[run.trainer]'):
        assert trainer_string_checks(check), check
    for fine in ('trainer.generates', 'TRAINERS[run.trainer].trl_step', '"max_length" in trainer',
                 '_running(trainer) == "validate"', 'spec.framework != TRL_TRAINERS.name',
                 'planned.dataset == data.trainer', 'run.eval_logits == "kept"'):
        assert not trainer_string_checks(fine), fine


def test_no_module_outside_the_table_compares_a_trainer_name_with_a_string() -> None:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if path == TABLE:
            continue
        checks = trainer_string_checks(path.read_text(encoding="utf-8"))
        if checks:
            found[str(path.relative_to(SRC))] = checks
    assert not found, f"trainer names compared with strings (read a field of vramscope.trainers instead): {found}"
