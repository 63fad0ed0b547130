"""A plan's recommendation is one function in ``planner/rules.py`` and its place in ``RULES``: the walker
(``planner/api._recommendations``) predicts its saving, drops the noise, judges it against the capacity and writes it
in the user's keys, whichever rule proposed it. A rule added to the tuple at run time shows in ``plan`` (text and
JSON) with nothing else touched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vramscope.cli import main
from vramscope.planner import plan, recommend, rules
from vramscope.planner.phases import RunPhases
from vramscope.planner.rules import Candidate, Situation
from vramscope.planner.settings import written_as
from vramscope.recipe import QLoraSpec

ARGV = ["plan", "--model", "Llama-2-7B", "--batch-size", "4", "--seq-len", "2048", "--gpu-memory", "9GiB"]


def half_rank(s: Situation) -> list[Candidate]:
    """The change the built-in lora_rank rule proposes at r=64 (r=16), under a name of its own."""
    if s.spec.lora_r != 64:
        return []
    return [Candidate(name="half_rank_twice", text="halve the LoRA rank twice, to 16: saves {saving:.2f} GiB",
                      change={"lora_r": 16}, spec=s.spec.with_(lora_r=16))]


def _plan(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, dict[str, Any]]:
    assert main([*ARGV, *extra]) == 0
    text = capsys.readouterr().out
    assert main([*ARGV, *extra, "--json"]) == 0
    return text, dict(json.loads(capsys.readouterr().out))


def test_a_rule_added_to_the_tuple_is_in_the_plan(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    text_before, before = _plan(capsys)
    monkeypatch.setattr(rules, "RULES", (*rules.RULES, half_rank))
    text, after = _plan(capsys)
    recs = {r["name"]: r for r in after["recommendations"]}
    ours, builtin = recs["half_rank_twice"], recs["lora_rank"]
    # the walker treats it as the built-in rule proposing the same change: the same saving, judgement and keys
    assert ours["change"] == builtin["change"] == {"lora_r": 16}
    assert ours["saving_bytes"] == builtin["saving_bytes"] > 0
    assert ours["sufficient"] == builtin["sufficient"] is not None
    assert ours["how"] == builtin["how"] == "LoraConfig(r=16)"
    gib = f"{builtin['saving_bytes'] / 2**30:.2f}"
    assert ours["text"] == f"halve the LoRA rank twice, to 16: saves {gib} GiB"
    assert f"    - {ours['text']}\n        LoraConfig(r=16)\n" in text
    # nothing else moved: the other recommendations and the rest of the plan are as without the rule
    assert [r for r in after["recommendations"] if r["name"] != "half_rank_twice"] == before["recommendations"]
    assert {k: v for k, v in after.items() if k != "recommendations"} == {
        k: v for k, v in before.items() if k != "recommendations"}
    assert text.replace(f"    - {ours['text']}\n        LoraConfig(r=16)\n", "") == text_before
    monkeypatch.undo()
    assert "half_rank_twice" not in {r["name"] for r in _plan(capsys)[1]["recommendations"]}


def test_the_walker_keeps_a_rules_own_saving_and_its_noise_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    def tiny(noise_floor: bool) -> rules.Rule:
        def rule(s: Situation) -> list[Candidate]:
            # a saving of its own, far under 1% of the step: noise unless the rule says otherwise
            return [Candidate(name=f"tiny_{noise_floor}", text="saves {saving:.2f} GiB", change={"seq_len": 8},
                              saving=1 << 20, noise_floor=noise_floor)]
        return rule

    monkeypatch.setattr(rules, "RULES", (tiny(True), tiny(False), rules.expandable_segments))
    recs = recommend("Llama-2-7B", 4, 2048, capacity_bytes=4 * 2**30)  # far over: no change is enough
    assert [r.name for r in recs] == ["expandable_segments", "tiny_False"]
    kept = recs[1]
    assert kept.saving_bytes == 1 << 20 and kept.text == "saves 0.00 GiB" and kept.sufficient is False
    assert kept.how == written_as({"seq_len": 8}, "hf")


def test_a_trl_trainers_step_leaves_out_the_candidates_that_are_its_phases_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def mine(under_trl_step: bool) -> rules.Rule:
        def rule(s: Situation) -> list[Candidate]:
            return [Candidate(name=f"shorter_{under_trl_step}", text="saves {saving:.2f} GiB",
                              change={"seq_len": s.seq // 2}, seq=s.seq // 2, under_trl_step=under_trl_step)]
        return rule

    monkeypatch.setattr(rules, "RULES", (mine(True), mine(False)))
    sft = plan("Llama-2-7B", 4, 1024, QLoraSpec(), gpu_memory="80GiB")
    assert {r.name for r in sft.recommendations} >= {"shorter_True", "shorter_False"}
    dpo = plan("Llama-2-7B", 4, 1024, QLoraSpec(), gpu_memory="80GiB", run=RunPhases(trainer="dpo"))
    names = {r.name for r in dpo.recommendations}
    assert "shorter_True" in names and "shorter_False" not in names
