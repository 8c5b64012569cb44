"""A small synthetic SNLI: the corpus behind the pipeline's `--smoke` mode.

The smoke mode runs every stage (prepare, vocabulary, embeddings, training,
evaluation) in CI and in demos, where there is no internet and where real SNLI
may not be copied into the repository. This module writes a stand-in laid out
like the official `snli_1.0.zip`, with the same JSON fields, so the code that
reads real SNLI reads it unchanged.

Sentences come from a tiny grammar of common English words, all in GloVe:
`A [adjective] subject is verb-ing [a object] [preposition the place] .`
Each premise gets one hypothesis per label, as SNLI's annotators wrote them,
and the label follows from the words by fixed rules, so a model can learn it:

- entailment generalizes: a subject, object or verb becomes its hypernym
  (man -> person, guitar -> instrument, running -> moving), or the adjective
  or the place is dropped;
- neutral adds what the premise does not say (an adjective or a place);
- contradiction swaps the subject for an incompatible one (man -> woman) or
  the activity for one with another verb (sleeping -> running).

About 1% of pairs get gold label `-` (no annotator majority), as in SNLI. The
n-ary parse is built as a Tree and the binary parse comes from spinn.trees.binarize,
so the two always agree. The same arguments always give the same zip bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from spinn.data.schema import LABELS, NO_CONSENSUS_LABEL
from spinn.ground.errors import SpinnError
from spinn.ground.io import atomic_path
from spinn.trees.binarize import binarize
from spinn.trees.tree import Tree, format_binary, format_ptb

SMOKE_SPLITS: dict[str, int] = {"train": 1500, "dev": 200, "test": 200}
SMOKE_ARCHIVE_ROOT = "snli_1.0"
SMOKE_ID_PREFIX = "smoke-"
"""Every smoke pair id starts so: laid out as SNLI, the corpus says by its ids that it is synthetic."""
MEMBER_TEMPLATE = "snli_1.0_{split}.jsonl"

ENTAILMENT, NEUTRAL, CONTRADICTION = LABELS
NO_CONSENSUS_SHARE = 0.01
ANNOTATORS = 5
CONSENSUS_VOTES = (3, 4, 5)
"""How many of the five annotators agree with the gold label; 3 is the least that makes a majority."""
MAX_GENERALIZATIONS = 2
NEUTRAL_GENERALIZE_SHARE = 0.5
"""Share of neutral hypotheses that also generalize a word, so a hypernym alone never means entailment."""
SUBJECT_SWAP_SHARE = 0.5
"""Share of contradictions made by swapping the subject; the rest swap the activity."""

HUMANS = ("man", "woman", "boy", "girl")
ANIMALS = ("dog", "cat")
INCOMPATIBLE_SUBJECTS = {"man": "woman", "woman": "man", "boy": "girl", "girl": "boy", "dog": "cat", "cat": "dog"}
HYPERNYMS = {
    "man": "person",
    "woman": "person",
    "boy": "child",
    "girl": "child",
    "dog": "animal",
    "cat": "animal",
    "guitar": "instrument",
    "piano": "instrument",
    "violin": "instrument",
    "horse": "animal",
    "bicycle": "vehicle",
    "running": "moving",
    "swimming": "moving",
    "jumping": "moving",
    "dancing": "moving",
}
ADJECTIVES = ("young", "old", "happy", "little")
PLACES = (("in", "park"), ("on", "beach"), ("on", "street"), ("in", "field"))
VOWELS = "aeiou"

# The premise's one optional modifier: none, an adjective, or a place; so neutral always has one to add.
NO_MODIFIER, ADJECTIVE, PLACE = "none", "adjective", "place"
MODIFIERS = (NO_MODIFIER, ADJECTIVE, PLACE)

ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
ZIP_CREATE_SYSTEM_UNIX = 3
ZIP_FILE_MODE = 0o644 << 16
ZIP_COMPRESSION = zipfile.ZIP_STORED
"""Stored, not deflated: the bytes then depend on no zlib build, only on the records."""


@dataclass(frozen=True)
class Activity:
    verb: str
    objects: tuple[str, ...] = ()
    """Empty for an intransitive verb."""
    animals_too: bool = False


ACTIVITIES = (
    Activity("sleeping", animals_too=True),
    Activity("running", animals_too=True),
    Activity("swimming", animals_too=True),
    Activity("jumping", animals_too=True),
    Activity("eating", animals_too=True),
    Activity("dancing"),
    Activity("playing", ("guitar", "piano", "violin")),
    Activity("riding", ("horse", "bicycle")),
)


@dataclass(frozen=True)
class Scene:
    """What one sentence says; every field but subject and verb is optional."""

    subject: str
    verb: str
    adjective: str | None = None
    obj: str | None = None
    place: tuple[str, str] | None = None


# --------------------------------------------------------------------------- the archive


def write_smoke_corpus(path: Path, *, sizes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """Write a zip laid out like snli_1.0.zip: snli_1.0/snli_1.0_{train,dev,test}.jsonl. Returns path.

    `sizes` overrides the pair count of any split in SMOKE_SPLITS. The zip is
    written atomically, with fixed dates, modes and member order.
    """
    counts = _split_counts(sizes)
    with atomic_path(Path(path)) as temporary, zipfile.ZipFile(temporary, "w") as archive:
        for split in sorted(counts):
            archive.writestr(_member_info(split), _jsonl(smoke_records(split, counts[split], seed)))
    return Path(path)


def smoke_records(split: str, count: int, seed: int) -> list[dict]:
    """SNLI-format records for one split (deterministic for (split, count, seed))."""
    if count < 0:
        raise SpinnError(f"smoke split {split!r}: pair count {count}, expected 0 or more")
    rng = _split_rng(seed, split)
    no_consensus = set(rng.sample(range(count), round(count * NO_CONSENSUS_SHARE)))
    return [
        _record(caption, label, premise, hypothesis, number in no_consensus, rng)
        for number, (caption, label, premise, hypothesis) in enumerate(islice(_pairs(split, rng), count))
    ]


def _split_counts(sizes: dict[str, int] | None) -> dict[str, int]:
    unknown = sorted(set(sizes or {}) - set(SMOKE_SPLITS))
    if unknown:
        raise SpinnError(f"smoke splits {', '.join(unknown)}: expected only {', '.join(SMOKE_SPLITS)}")
    return {**SMOKE_SPLITS, **(sizes or {})}


def _split_rng(seed: int, split: str) -> random.Random:
    """A generator per split, seeded through SHA-256 (Python's hash() is salted per process)."""
    digest = hashlib.sha256(f"{seed}:{split}".encode()).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _member_info(split: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(f"{SMOKE_ARCHIVE_ROOT}/{MEMBER_TEMPLATE.format(split=split)}", date_time=ZIP_DATE_TIME)
    info.compress_type = ZIP_COMPRESSION
    info.create_system = ZIP_CREATE_SYSTEM_UNIX
    info.external_attr = ZIP_FILE_MODE
    return info


def _jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n" for record in records).encode()


# --------------------------------------------------------------------------- pairs and records


def _pairs(split: str, rng: random.Random) -> Iterator[tuple[str, str, Scene, Scene]]:
    """Endless (caption id, label, premise, hypothesis): each premise once per label, in shuffled order."""
    caption_number = 0
    while True:
        premise = _premise(rng)
        caption = f"{SMOKE_ID_PREFIX}{split}-{caption_number:05d}.jpg#0"
        for label in rng.sample(LABELS, len(LABELS)):
            yield caption, label, premise, HYPOTHESIS_RULES[label](premise, rng)
        caption_number += 1


def _record(
    caption: str, label: str, premise: Scene, hypothesis: Scene, no_consensus: bool, rng: random.Random
) -> dict:
    """One SNLI line; the pair id's last letter names the label the hypothesis was written for."""
    record = {
        "annotator_labels": _annotator_labels(label, no_consensus, rng),
        "captionID": caption,
        "gold_label": NO_CONSENSUS_LABEL if no_consensus else label,
        "pairID": f"{caption}r1{label[0]}",
    }
    for field, scene in (("sentence1", premise), ("sentence2", hypothesis)):
        tree = _scene_tree(scene)
        words = tree.leaves()
        record[field] = " ".join(words[:-1]) + words[-1]
        record[f"{field}_parse"] = format_ptb(tree)
        record[f"{field}_binary_parse"] = format_binary(binarize(tree))
    return record


def _annotator_labels(label: str, no_consensus: bool, rng: random.Random) -> list[str]:
    """Five votes, the writer's own first: a majority for `label`, or a 2-2-1 split with none."""
    others = [other for other in LABELS if other != label]
    rng.shuffle(others)
    if no_consensus:
        rest = [label, others[0], others[0], others[1]]
    else:
        agreeing = rng.choice(CONSENSUS_VOTES)
        rest = [label] * (agreeing - 1) + [rng.choice(others) for _ in range(ANNOTATORS - agreeing)]
    rng.shuffle(rest)
    return [label, *rest]


# --------------------------------------------------------------------------- the grammar and the label rules


def _premise(rng: random.Random) -> Scene:
    subject = rng.choice(HUMANS + ANIMALS)
    activity = rng.choice(_activities_for(subject))
    modifier = rng.choice(MODIFIERS)
    return Scene(
        subject=subject,
        verb=activity.verb,
        adjective=rng.choice(ADJECTIVES) if modifier == ADJECTIVE else None,
        obj=rng.choice(activity.objects) if activity.objects else None,
        place=rng.choice(PLACES) if modifier == PLACE else None,
    )


def _activities_for(subject: str) -> list[Activity]:
    return [activity for activity in ACTIVITIES if activity.animals_too or subject in HUMANS]


def _generalizations(scene: Scene) -> list[dict]:
    """Edits that keep the scene true: a hypernym for a word, or a dropped modifier."""
    edits = [
        {field: HYPERNYMS[word]}
        for field, word in (("subject", scene.subject), ("verb", scene.verb), ("obj", scene.obj))
        if word in HYPERNYMS
    ]
    if scene.adjective:
        edits.append({"adjective": None})
    if scene.place:
        edits.append({"place": None})
    return edits


def _entailment(premise: Scene, rng: random.Random) -> Scene:
    edits = _generalizations(premise)
    chosen = rng.sample(edits, rng.randint(1, min(MAX_GENERALIZATIONS, len(edits))))
    return dataclasses.replace(premise, **{key: value for edit in chosen for key, value in edit.items()})


def _neutral(premise: Scene, rng: random.Random) -> Scene:
    """Add the modifier the premise lacks; sometimes also generalize, so hypernyms do not give the label away."""
    additions = []
    if premise.adjective is None:
        additions.append({"adjective": rng.choice(ADJECTIVES)})
    if premise.place is None:
        additions.append({"place": rng.choice(PLACES)})
    edit = dict(rng.choice(additions))
    if rng.random() < NEUTRAL_GENERALIZE_SHARE:
        edit |= rng.choice([change for change in _generalizations(premise) if not change.keys() & edit.keys()])
    return dataclasses.replace(premise, **edit)


def _contradiction(premise: Scene, rng: random.Random) -> Scene:
    """Swap the subject for its incompatible partner, or the activity for one with another verb."""
    if rng.random() < SUBJECT_SWAP_SHARE:
        return dataclasses.replace(premise, subject=INCOMPATIBLE_SUBJECTS[premise.subject])
    others = [activity for activity in _activities_for(premise.subject) if activity.verb != premise.verb]
    activity = rng.choice(others)
    obj = rng.choice(activity.objects) if activity.objects else None
    return dataclasses.replace(premise, verb=activity.verb, obj=obj)


HYPOTHESIS_RULES = {ENTAILMENT: _entailment, NEUTRAL: _neutral, CONTRADICTION: _contradiction}


# --------------------------------------------------------------------------- trees


def _scene_tree(scene: Scene) -> Tree:
    """The labelled n-ary tree, `(ROOT (S (NP ...) (VP (VBZ is) (VP (VBG ...) ...)) (. .)))`."""
    subject = _noun_phrase(scene.subject, scene.adjective, capitalize=True)
    inner = [_word("VBG", scene.verb)]
    if scene.obj:
        inner.append(_noun_phrase(scene.obj))
    if scene.place:
        preposition, place = scene.place
        inner.append(Tree("PP", (_word("IN", preposition), _noun_phrase(place, definite=True))))
    predicate = Tree("VP", (_word("VBZ", "is"), Tree("VP", tuple(inner))))
    return Tree("ROOT", (Tree("S", (subject, predicate, _word(".", "."))),))


def _noun_phrase(noun: str, adjective: str | None = None, *, definite: bool = False, capitalize: bool = False) -> Tree:
    first = adjective or noun
    article = "the" if definite else ("an" if first[0] in VOWELS else "a")
    words = [_word("DT", article.capitalize() if capitalize else article)]
    if adjective:
        words.append(_word("JJ", adjective))
    words.append(_word("NN", noun))
    return Tree("NP", tuple(words))


def _word(tag: str, word: str) -> Tree:
    return Tree(tag, (Tree(word),))
