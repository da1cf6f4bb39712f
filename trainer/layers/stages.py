"""How ``--mode layers`` cuts a model into stages: which consecutive layers
each worker task (or, with ``--devices``, each local device) holds.

Plain Python: the launcher runs the same checks as the trainer before any
task starts (``check_job``, the layers mode's catalog entry's check), so a
bad ``--placement`` is one line and exit 2 at once, not a failed job.

A model is the list of its layers in call order (``trainer/layers/architectures.py``);
a stage is a run of consecutive layers, on a slot (worker task i, or device
i). The default split gives each slot one stage and cuts the list where the
largest stage holds the fewest parameter bytes (the memory each task needs,
which is what model parallelism spreads). ``--stages N`` asks for N stages
cut the same way; ``--placement conv:0,dense:1`` names them by layer-name
prefixes instead: a layer goes to the slot of the longest prefix it starts
with, and a layer no prefix names goes with the layer before it (pooling,
flatten and dropout with the layer they follow).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainer.layers.architectures import LayerSpec
from trainer.options import JobFacts, Option, positive_int

DEVICE_CHOICES = ("tasks", "gpu", "cpu")
EXAMPLE = "conv:0,dense:1"

_GROUP = "model parallelism (--mode layers)"
# The layers mode's own flags (``--stages`` and the rest), declared beside
# the cutting they set; its catalog entry lists them.
OPTIONS = (
    Option(
        "stages",
        positive_int,
        help="layers: stages to cut the model into (default one per worker; "
        "--devices gpu: one per GPU), where the largest holds the fewest parameter bytes",
        group=_GROUP,
    ),
    Option(
        "placement",
        help=f"layers: which worker holds which layers, by layer-name prefix, e.g. "
        f"{EXAMPLE}; a layer no prefix names goes with the layer before it",
        group=_GROUP,
    ),
    Option(
        "micro-batches",
        positive_int,
        1,
        "layers: cut each batch into this many pieces that flow through the stages one "
        "after the other (GPipe): stage k works on piece j+1 while stage k+1 works on piece j",
        group=_GROUP,
    ),
    Option(
        "devices",
        default="tasks",
        choices=DEVICE_CHOICES,
        help="layers: the stages go to the worker tasks, to this node's GPUs, or to its "
        "CPU split into one logical device per stage (a split tried on one machine)",
        group=_GROUP,
    ),
)


@dataclass(frozen=True)
class Stage:
    """Layers ``layers`` (consecutive), on slot ``slot``."""

    slot: int
    layers: tuple[str, ...]
    bytes: int

    @property
    def span(self) -> str:
        return self.layers[0] if len(self.layers) == 1 else f"{self.layers[0]}..{self.layers[-1]}"


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]
    # How the split was chosen, in a few words.
    how: str

    def slot_of(self) -> dict[str, int]:
        """Layer name -> its slot."""
        return {name: stage.slot for stage in self.stages for name in stage.layers}

    def describe(self, slot_word: str) -> str:
        held = "; ".join(
            f"{slot_word} {s.slot} holds {s.span} ({s.bytes / 1e6:.2f} MB)" for s in self.stages
        )
        return f"{len(self.stages)} stage(s), {self.how}: {held}"


def _units(layers: Sequence[LayerSpec]) -> list[list[LayerSpec]]:
    """The layers grouped so that every group starts with a layer that has
    parameters: a layer without (pooling, flatten, dropout) stays with the
    one before it; leading ones with the first group."""
    units: list[list[LayerSpec]] = []
    pending: list[LayerSpec] = []
    for layer in layers:
        if layer.params:
            units.append([*pending, layer])
            pending = []
        elif units:
            units[-1].append(layer)
        else:
            pending.append(layer)
    if pending:  # a model without any parameters
        units.append(pending)
    return units


def balanced(units: Sequence[Sequence[LayerSpec]], count: int) -> list[int]:
    """Where to cut ``units`` into ``count`` runs so that the largest run
    (in bytes) is as small as it can be: the start index of each run. Among
    equal splits, the one with the earliest cuts."""
    sizes = [sum(layer.bytes for layer in unit) for unit in units]
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    inf = float("inf")
    # best[k][i]: the smallest largest run of units[:i] in k runs.
    best = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    starts, i = [], n
    for k in range(count, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def _stage(slot: int, layers: Sequence[LayerSpec]) -> Stage:
    return Stage(slot, tuple(layer.name for layer in layers), sum(x.bytes for x in layers))


def split_evenly(layers: Sequence[LayerSpec], count: int, how: str) -> StagePlan:
    units = _units(layers)
    starts = balanced(units, count)
    ends = [*starts[1:], len(units)]
    stages = [
        _stage(slot, [layer for unit in units[start:end] for layer in unit])
        for slot, (start, end) in enumerate(zip(starts, ends, strict=True))
    ]
    return StagePlan(tuple(stages), how)


def parse_placement(text: str) -> list[tuple[str, int]]:
    """``conv:0,dense:1`` -> [("conv", 0), ("dense", 1)]; ValueError naming
    the bad part."""
    pairs: list[tuple[str, int]] = []
    for item in text.split(","):
        prefix, colon, slot = item.strip().partition(":")
        if not colon or not prefix.strip() or not slot.strip().isdigit():
            raise ValueError(
                f"--placement: {item.strip()!r} is not PREFIX:TASK (e.g. {EXAMPLE})"
            )
        if prefix.strip() in (p for p, _ in pairs):
            raise ValueError(f"--placement names {prefix.strip()!r} twice")
        pairs.append((prefix.strip(), int(slot)))
    return pairs


def place_by_prefix(
    model: str, layers: Sequence[LayerSpec], pairs: Sequence[tuple[str, int]]
) -> list[int]:
    """Each layer's slot, by the longest prefix it starts with; a layer no
    prefix names goes with the layer before it (the first ones: with the
    first named)."""
    names = [layer.name for layer in layers]
    for prefix, _ in pairs:
        if not any(name.startswith(prefix) for name in names):
            raise ValueError(
                f"--placement: no layer of {model} starts with {prefix!r}; "
                f"its layers: {', '.join(names)}"
            )
    slots: list[int | None] = []
    for name in names:
        matching = [(len(p), slot) for p, slot in pairs if name.startswith(p)]
        slots.append(max(matching)[1] if matching else None)
    first = next(s for s in slots if s is not None)
    filled, last = [], first
    for slot in slots:
        last = slot if slot is not None else last
        filled.append(last)
    return filled


def _blocks(layers: Sequence[LayerSpec], slots: Sequence[int]) -> list[Stage]:
    stages: list[Stage] = []
    run: list[LayerSpec] = []
    for i, layer in enumerate(layers):
        run.append(layer)
        if i + 1 == len(layers) or slots[i + 1] != slots[i]:
            stages.append(_stage(slots[i], run))
            run = []
    return stages


@dataclass(frozen=True)
class Slots:
    """Where stages can go: ``count`` worker tasks (every one must hold a
    stage) or local devices (some may stay unused); count None: not known
    here (the launcher does not know a node's GPUs)."""

    word: str  # "worker", "GPU", "CPU"
    count: int | None
    all_used: bool

    def exists(self, slot: int) -> bool:
        return self.count is None or slot < self.count

    def describe(self) -> str:
        word = "worker" if self.word == "worker" else f"{self.word} device"
        return f"{self.count} {word}(s) (0 to {(self.count or 1) - 1})"


def plan(
    model: str,
    layers: Sequence[LayerSpec],
    slots: Slots,
    *,
    stages: int | None,
    placement: str | None,
) -> StagePlan:
    """The stages of ``model`` on ``slots``, as the flags ask; ValueError
    (one line naming the bad part) for a split that leaves a task empty,
    names a task or a layer that does not exist, or cannot be cut so."""
    if stages is not None and placement:
        raise ValueError("--stages and --placement: give one of them")
    weighted = sum(1 for layer in layers if layer.params)
    if placement:
        result = StagePlan(
            tuple(_blocks(layers, place_by_prefix(model, layers, parse_placement(placement)))),
            f"as --placement {placement} names them",
        )
    else:
        count = stages if stages is not None else slots.count
        if count is None:
            raise ValueError(f"--stages: give the number of {slots.word} devices to use")
        if count > weighted:
            raise ValueError(
                f"--stages {count}: {model} has {weighted} layers with parameters, "
                "and each stage needs one"
            )
        how = f"one per {slots.word}" if stages is None else f"{count} asked for"
        result = split_evenly(layers, count, how + ", cut where the largest holds the fewest bytes")
    _check(result, slots)
    return result


def _check(result: StagePlan, slots: Slots) -> None:
    for stage in result.stages:
        if not slots.exists(stage.slot):
            raise ValueError(
                f"{slots.word} {stage.slot} does not exist: the job has {slots.describe()}"
            )
        if not stage.bytes:
            raise ValueError(
                f"{slots.word} {stage.slot} would hold only {stage.span}, which has no "
                "parameters; give it a layer with weights"
            )
    seen: dict[int, Stage] = {}
    for stage in result.stages:
        if stage.slot in seen:
            raise ValueError(
                f"{slots.word} {stage.slot} would hold two separate blocks "
                f"({seen[stage.slot].span} and {stage.span}); a task holds consecutive layers"
            )
        seen[stage.slot] = stage
    if slots.all_used and slots.count is not None:
        empty = [slot for slot in range(slots.count) if slot not in seen]
        if empty:
            raise ValueError(
                f"the split leaves {slots.word} {', '.join(map(str, empty))} empty: give "
                f"{slots.count} stages, one per worker, or fewer workers in roles"
            )


def slots_for(devices: str, count: int | None) -> Slots:
    """The slots of ``--devices``: ``count`` workers, or this node's
    ``count`` devices (None: unknown)."""
    if devices == "tasks":
        return Slots("worker", count, all_used=True)
    return Slots(devices.upper(), count, all_used=False)


def check_job(model: str, layers: Sequence[LayerSpec] | None, facts: JobFacts) -> list[str]:
    """The launcher's check of a layers job before any task starts: the
    plan as a line to show, and one line about a ps it does not use;
    ValueError for what the trainer would refuse."""
    values = facts.options
    if layers is None:
        raise ValueError(f"--mode layers: {model} has no list of layers to split")
    micro = values["micro_batches"]
    if facts.batch_size % micro:
        raise ValueError(
            f"--micro-batches {micro} does not divide --batch-size {facts.batch_size}"
        )
    devices = values["devices"]
    slots = slots_for(devices, len(facts.workers) if devices == "tasks" else None)
    notes: list[str] = []
    if devices == "tasks" or values["stages"] is not None or values["placement"]:
        found = plan(
            model, layers, slots, stages=values["stages"], placement=values["placement"]
        )
        if devices == "tasks":
            notes.append(f"layers: {found.describe(slots.word)}")
    if devices != "tasks" and facts.workers:
        notes.append(
            f"layers --devices {devices}: the stages go to the chief's own devices; "
            f"the workers ({', '.join(facts.workers)}) start but hold nothing"
        )
    if facts.ps:
        notes.append(
            f"layers does not use the ps ({', '.join(facts.ps)}): no ps task starts, "
            "the workers hold the variables"
        )
    return notes
