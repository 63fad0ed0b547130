"""What a training script says about its run, read statically with :mod:`ast`: never imported, never run.

Many people launch their own script (PEFT's ``examples/sft/train.py``, an Unsloth notebook saved as ``.py``,
a copy of TRL's ``dpo.py``). The flags on the command line are then only half of the run: the rest is in the
script's own dataclass defaults (``max_seq_length: int = field(default=512)``), the trainer it builds
(``SFTTrainer(...)``, ``DPOTrainer(...)``), and the keyword arguments of the calls that load the model
(``BitsAndBytesConfig(load_in_4bit=True, ...)``, ``LoraConfig(r=16, ...)``,
``FastLanguageModel.from_pretrained(max_seq_length=2048, ...)``). :func:`read_script` collects those into
:class:`ScriptFacts`; the program readers take them as the lowest-priority source (the command line wins).

Only literals are read: a constant, a list of constants, ``torch.bfloat16``, or a module-level name bound to
one of those (``max_seq_length = 2048`` and then ``max_seq_length = max_seq_length``). Anything else is left
out rather than guessed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

# The trainers a script may build, by class name, and the kind of training each does.
TRAINER_CLASSES: dict[str, str] = {
    "SFTTrainer": "sft", "UnslothTrainer": "sft", "DPOTrainer": "dpo", "GRPOTrainer": "grpo", "KTOTrainer": "kto",
    "ORPOTrainer": "orpo", "CPOTrainer": "orpo", "RewardTrainer": "reward", "PPOTrainer": "ppo", "RLOOTrainer": "grpo",
    "Trainer": "sft", "Seq2SeqTrainer": "sft",
}
# The config classes whose keyword arguments are TrainingArguments-shaped (batch, accumulation, lengths).
CONFIG_CLASSES: dict[str, str] = {
    "SFTConfig": "sft", "UnslothTrainingArguments": "sft", "DPOConfig": "dpo", "GRPOConfig": "grpo",
    "KTOConfig": "kto", "ORPOConfig": "orpo", "CPOConfig": "orpo", "RewardConfig": "reward", "PPOConfig": "ppo",
    "RLOOConfig": "grpo", "TrainingArguments": "sft", "Seq2SeqTrainingArguments": "sft",
}
_PLAIN_TRAINERS = ("Trainer", "Seq2SeqTrainer")
_TRL_PARSERS = ("TrlParser", "H4ArgumentParser")
_MAX_SOURCE = 2 << 20  # a training script is a few KiB; a larger file is not one


@dataclass
class ScriptFacts:
    """What :func:`read_script` found; every mapping is ``keyword -> literal value``.

    Attributes:
        parses: the text is Python that :func:`ast.parse` accepts.
        trainers: trainer classes the script constructs (``SFTTrainer``, ``DPOTrainer``, ...), in order.
        config_kwargs: the keyword arguments of the TrainingArguments-shaped configs it builds (``SFTConfig``,
            ``DPOConfig``, ``TrainingArguments`` ...), merged in the order written.
        config_kinds: the trainer kinds those configs belong to.
        bnb: ``BitsAndBytesConfig(...)``'s keyword arguments.
        lora: ``LoraConfig(...)``'s keyword arguments.
        from_pretrained: the keyword arguments of a model loader's ``from_pretrained`` (``AutoModelFor*``,
            Unsloth's ``FastLanguageModel`` / ``FastModel``).
        unsloth_load: Unsloth's ``from_pretrained`` keyword arguments (also in ``from_pretrained``).
        unsloth_peft: Unsloth's ``get_peft_model`` keyword arguments.
        uses_unsloth: the script imports unsloth.
        dataclass_defaults: every ``@dataclass`` field's literal default (``field(default=...)`` or ``= ...``).
        bnb_called: it builds a ``BitsAndBytesConfig`` (whatever its arguments).
        bnb_gates: the names an ``if`` around that call tests (``if model_args.load_in_4bit and cuda:`` gives
            ``load_in_4bit`` and ``cuda``): the literal ``load_in_4bit=True`` inside holds only when they do.
        loads_model: it calls ``AutoModel*.from_pretrained`` itself (so how it loads the model is visible).
        loader_keys: every keyword that call passes, literal or not (``quantization_config``, ``load_in_4bit``).
        parser: ``hf`` (``HfArgumentParser``), ``trl`` (``TrlParser`` / ``H4ArgumentParser``), or None.
        parser_classes: the dataclasses handed to that parser (``SFTConfig`` there means TRL's defaults).
        imports: the top-level packages it imports (``trl``, ``peft``, ``unsloth``, ``transformers`` ...).
        imported_names: the names it imports from them (``TrlParser``, ``SFTConfig`` ...).
    """

    parses: bool = False
    trainers: list[str] = field(default_factory=list)
    config_kwargs: dict[str, Any] = field(default_factory=dict)
    config_kinds: list[str] = field(default_factory=list)
    bnb: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] = field(default_factory=dict)
    from_pretrained: dict[str, Any] = field(default_factory=dict)
    unsloth_load: dict[str, Any] = field(default_factory=dict)
    unsloth_peft: dict[str, Any] = field(default_factory=dict)
    uses_unsloth: bool = False
    dataclass_defaults: dict[str, Any] = field(default_factory=dict)
    bnb_called: bool = False
    bnb_gates: set[str] = field(default_factory=set)
    loads_model: bool = False
    loader_keys: set[str] = field(default_factory=set)
    parser: str | None = None
    parser_classes: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)
    imported_names: set[str] = field(default_factory=set)

    @property
    def trainer_kind(self) -> str | None:
        """The kind of the trainer it builds (the first TRL one), else its config's kind."""
        kinds = [TRAINER_CLASSES[t] for t in self.trainers if t not in _PLAIN_TRAINERS]
        if kinds:
            return kinds[0]
        if self.config_kinds and "trl" in self.imports:
            return self.config_kinds[0]
        return "sft" if self.trainers else None

    @property
    def builds_trl(self) -> bool:
        """It builds one of TRL's trainers (so TRL's defaults apply, not TrainingArguments')."""
        return any(t not in _PLAIN_TRAINERS for t in self.trainers) or (
            "trl" in self.imports and any(k in self.config_kinds for k in ("sft", "dpo", "grpo", "kto", "orpo")))


class _Names(ast.NodeVisitor):
    """Module-level ``name = literal`` bindings (the last one written wins, as a notebook run top to bottom)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def visit_Assign(self, node: ast.Assign) -> None:
        value = literal(node.value, self.values)
        if value is not _UNKNOWN:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.values[target.id] = value


_UNKNOWN = object()


def literal(node: ast.AST, names: dict[str, Any]) -> Any:
    """A node's value when it is a literal, ``torch.<dtype>``, a known name or a list of those; else _UNKNOWN."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id, _UNKNOWN)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        return node.attr  # torch.bfloat16 -> "bfloat16"
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [literal(e, names) for e in node.elts]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = literal(node.operand, names)
        return -inner if isinstance(inner, (int, float)) else _UNKNOWN
    if isinstance(node, ast.Call) and _call_name(node) == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                return literal(kw.value, names)
        return _UNKNOWN
    return _UNKNOWN


def _call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def _owner(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f.value.id
    return ""


def _kwargs(node: ast.Call, names: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            continue
        value = literal(kw.value, names)
        if value is not _UNKNOWN:
            out[kw.arg] = value
        elif isinstance(kw.value, ast.Call) and _call_name(kw.value) == "BitsAndBytesConfig":
            out[kw.arg] = "BitsAndBytesConfig"
    return out


def read_script(text: str) -> ScriptFacts:
    """The static reading of a script's source (empty :class:`ScriptFacts` when it does not parse)."""
    facts = ScriptFacts()
    if not text or len(text) > _MAX_SOURCE:
        return facts
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # A notebook saved as .py keeps its shell and magic lines (!pip install ..., %%capture): drop them.
        cleaned = "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in text.splitlines())
        try:
            tree = ast.parse(cleaned)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return facts
    facts.parses = True
    names = _Names()
    for stmt in tree.body:
        names.visit(stmt)
    values = names.values
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            facts.imports.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            facts.imports.add(node.module.split(".")[0])
            facts.imported_names.update(a.name for a in node.names)
        elif isinstance(node, ast.ClassDef) and any(_is_dataclass(d) for d in node.decorator_list):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    value = literal(stmt.value, values)
                    if value is not _UNKNOWN:
                        facts.dataclass_defaults[stmt.target.id] = value
        elif isinstance(node, ast.Call):
            _call(node, facts, values)
        if isinstance(node, ast.If) and any(isinstance(n, ast.Call) and _call_name(n) == "BitsAndBytesConfig"
                                            for stmt in node.body for n in ast.walk(stmt)):
            facts.bnb_gates.update(n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.test)
                                   if isinstance(n, ast.Name | ast.Attribute))
    facts.uses_unsloth = "unsloth" in facts.imports or bool(facts.unsloth_load or facts.unsloth_peft)
    return facts


def _is_dataclass(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass")


def _call(node: ast.Call, facts: ScriptFacts, values: dict[str, Any]) -> None:
    name = _call_name(node)
    if name in TRAINER_CLASSES and isinstance(node.func, ast.Name | ast.Attribute):
        facts.trainers.append(name)
        # Older TRL took the lengths as the trainer's own arguments (DPOTrainer(max_length=..., ...)).
        kwargs = _kwargs(node, values)
        facts.config_kwargs.update({k: v for k, v in kwargs.items() if k not in ("model", "args", "tokenizer")})
    elif name in CONFIG_CLASSES:
        facts.config_kinds.append(CONFIG_CLASSES[name])
        facts.config_kwargs.update(_kwargs(node, values))
    elif name == "BitsAndBytesConfig":
        facts.bnb_called = True
        facts.bnb.update(_kwargs(node, values))
    elif name == "LoraConfig":
        facts.lora.update(_kwargs(node, values))
    elif name == "HfArgumentParser" or name in _TRL_PARSERS:
        facts.parser = "trl" if name in _TRL_PARSERS else facts.parser or "hf"
        for arg in node.args:
            items = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
            facts.parser_classes += [e.id if isinstance(e, ast.Name) else e.attr for e in items
                                     if isinstance(e, (ast.Name, ast.Attribute))]
    elif name == "from_pretrained" and _owner(node) in ("FastLanguageModel", "FastModel", "FastVisionModel"):
        facts.unsloth_load.update(_kwargs(node, values))
        facts.from_pretrained.update(facts.unsloth_load)
    elif name == "get_peft_model" and _owner(node) in ("FastLanguageModel", "FastModel", "FastVisionModel"):
        facts.unsloth_peft.update(_kwargs(node, values))
    elif name == "from_pretrained" and _owner(node).startswith("AutoModel"):
        facts.loads_model = True
        facts.loader_keys.update(kw.arg for kw in node.keywords if kw.arg is not None)
        if any(kw.arg is None for kw in node.keywords):
            facts.loader_keys.add("**kwargs")  # from_pretrained(**model_kwargs): anything may be in there
        facts.from_pretrained.update(_kwargs(node, values))
