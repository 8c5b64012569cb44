"""Builders that several test modules share (test modules import them from here, never from one another;
tests/test_layers.py checks it): where ../shared's real SNLI files and Stanza models are, the `spinn`
executable, the one tiny training model and its command, a migrated MLflow store's copy, a copy of the
checkout, README's commands, the smoke corpus's pairs as plain rows, files of rows, hand-written two-way corpus
files (GLUE, HANS, SciTail), the one-error-line check, damaged label runs, the label flow's Prefect records, the
process checks of the kill tests, the thread rule's trace (spinn/ground/cores.py) that the end-to-end tests read, and
tiny float64 models with seeded synthetic batches (no ../shared needed) for the encoder tests."""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from spinn.data.example import Example
from spinn.data.pairs import corpus_vocabulary, encode_pairs, read_raw_pairs
from spinn.data.vocab import Vocabulary
from spinn.ground import cores
from spinn.model.batch import Batch, make_batch
from spinn.model.checkpoint import Checkpoint
from spinn.model.config import TREE_VARIANTS, SPINNConfig, TransitionSource
from spinn.model.policy import draw_uniforms
from spinn.model.spinn import SPINN, random_vectors
from spinn.training.train_config import TrainConfig
from spinn.trees.transitions import REDUCE, SHIFT

ROOT = Path(__file__).resolve().parents[1]
"""This checkout."""
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared"
"""The real data and models beside the checkout (../shared): absent, the tests that need them skip."""
SNLI_DIR = SHARED / "data" / "snli"
STANZA_DIR = SHARED / "stanza" / "stanza_resources"
RELEASE = Path(__file__).parent / "fixtures" / "release-0.1.0"
"""Release 0.1.0's checkpoint, vocabulary, config, pairs and predictions, as that release wrote them."""
SPINN_COMMAND = Path(sys.executable).with_name("spinn")
"""The `spinn` executable of the environment running the tests."""
CLI_TIMEOUT_S = 300
POLL_S = 0.1
TINY_MODEL = {"d_hidden": 16, "d_tracker": 8, "mlp_dim": 32, "mlp_layers": 1}
"""The one tiny model every test runs (trained, smoke, or built with random vectors as TINY): a step takes
milliseconds, and a dozen steps on the 1,024 real pairs still learn enough to beat a run that learns nothing
(test_train's alias test needs that; half the width does not)."""
TINY_EMBED = 8
"""The width of the random word vectors a tiny model gets where no embeddings file is read."""
TINY_MODEL_SETTINGS = tuple(f"model.{key}={value}" for key, value in TINY_MODEL.items())
"""TINY_MODEL as a command's --set settings."""
TINY_TRAIN_SETTINGS = (*TINY_MODEL_SETTINGS, "threads=1")
PREPARED_DEV_PAIRS = 120
"""The real dev pairs that the `snli_prepared` fixture prepares (one of them has gold '-')."""

SMALL_SMOKE_CORPUS = {"train": 300, "dev": 60, "test": 60}
"""A fifth of the smoke corpus, for flow runs whose stages do the same work on fewer pairs."""

SMOKE_REGISTERED = "label-test"
SMOKE_TRAINING = {
    "model": {"variant": "spinn", **TINY_MODEL},
    "batch_size": 32,
    "max_steps": 40,
    "eval_every": 20,
    "log_every": 10,
    "checkpoint_every": 20,
    "device": "cpu",
    "threads": 1,
    "experiment": SMOKE_REGISTERED,
    "registered_model": SMOKE_REGISTERED,
}
"""The smoke model the labelling tests share (conftest's smoke_model): the tiny model, trained once per run."""


def snli_file(name: str) -> Path:
    """A real SNLI file in ../shared/data/snli; the test skips, saying so, where it is absent."""
    path = SNLI_DIR / name
    if not path.exists():
        pytest.skip(f"real SNLI file {path} is absent (../shared is not beside this checkout)")
    return path


def stanza_dir() -> Path:
    """The offline Stanza models in ../shared; the test skips, saying so, where they are absent."""
    if not STANZA_DIR.is_dir():
        pytest.skip(f"the offline Stanza models {STANZA_DIR} are absent (../shared is not beside this checkout)")
    return STANZA_DIR


def spinn(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`spinn ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([str(SPINN_COMMAND), *args], capture_output=True, text=True, cwd=cwd, timeout=CLI_TIMEOUT_S)


def tiny_config(**settings) -> TrainConfig:
    """The tiny model that logs every step, and evaluates and checkpoints once, at its last step (unless told)."""
    last_step = settings.get("max_steps", 1)
    base = {
        "model": {"variant": "spinn", **TINY_MODEL},
        "batch_size": 16,
        "seed": 7,
        "device": "cpu",
        "log_every": 1,
        "eval_every": last_step,
        "checkpoint_every": last_step,
        "threads": 1,
    }
    base.update(settings)
    return TrainConfig.build(base)


def copy_store(migrated: Path, database: Path) -> str:
    """A fresh-but-migrated MLflow store at `database` (a copy of the `migrated_store` fixture's); its URI."""
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated, database)
    return f"sqlite:///{database}"


def copy_checkout(destination: Path) -> Path:
    """A copy of this checkout as a user's clone has it, for tests that run the project's own commands (DVC,
    `prefect deploy`, README's): the files git would see here (tracked, or untracked and not ignored), without
    any data/, so this checkout stays clean and each test owns its data/."""
    listing = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if name.startswith("data/") or not source.is_file():  # listed but deleted in the working tree
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return destination


BASH_BLOCK = r"```bash\n(.+?)\n```"


def readme_block(heading: str, marker: str) -> str:
    """The first ```bash block under `heading` in README whose command contains `marker`."""
    section = README.read_text(encoding="utf-8").split(heading, 1)[1]
    for block in re.findall(BASH_BLOCK, section, re.DOTALL):
        if marker in block:
            return block.strip()
    raise AssertionError(f"no command with {marker!r} under {heading!r} in README.md")


def register_as_release_0_1_0(uri: str, tags: dict[str, str] | None = None, description: str = "") -> None:
    """Register the release's model in the store at `uri` as 0.1.0 did: its files logged under the run's
    `model/` folder, that folder registered as version 1 of `spinn`, @champion on it."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("release-0.1.0")
    with mlflow.start_run() as run:
        for name in ("checkpoint.pt", "vocab.json", "config.json"):
            mlflow.log_artifact(str(RELEASE / name), artifact_path="model")
    client = mlflow.MlflowClient()
    client.create_registered_model("spinn")
    version = client.create_model_version(
        "spinn", f"{run.info.artifact_uri}/model", run_id=run.info.run_id, tags=tags, description=description
    )
    client.set_registered_model_alias("spinn", "champion", version.version)


def snli_line(pair_id: str) -> str:
    """One well-formed SNLI JSON line of id `pair_id`."""
    return json.dumps(
        {
            "gold_label": "entailment",
            "pairID": pair_id,
            "sentence1": "A dog runs.",
            "sentence1_binary_parse": "( ( A dog ) ( runs . ) )",
            "sentence2": "Animals move.",
            "sentence2_binary_parse": "( Animals ( move . ) )",
        }
    )


def one_error_line(stderr: str) -> str:
    """The command's one error line, its last word on stderr (progress bars and MLflow's notes may come
    before it), and no traceback."""
    errors = [line for line in stderr.strip().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and stderr.strip().endswith(errors[0]) and "Traceback" not in stderr, stderr
    return errors[0]


def set_options(settings: tuple[str, ...] | list[str]) -> list[str]:
    """KEY=VALUE settings as a command's `--set KEY=VALUE` options."""
    return [word for setting in settings for word in ("--set", setting)]


def tiny_train_arguments(prepared: Path, output_dir: Path, *settings: str) -> list[str]:
    """`train` on the smoke model's prepared splits, with the tiny model and `settings` (KEY=VALUE)."""
    arguments = ["train", "--train", str(prepared / "train.parquet"), "--dev", str(prepared / "dev.parquet")]
    arguments += ["--embeddings-dir", str(prepared.parent / "embeddings"), "--output-dir", str(output_dir)]
    arguments += ["--no-register", "--no-progress", "--device", "cpu"]
    for setting in (*TINY_TRAIN_SETTINGS, *settings):
        arguments += ["--set", setting]
    return arguments


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition` until it holds; fail the test naming `what` when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(POLL_S)


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children first."""
    found = children(pid)
    return found + [grandchild for child in found for grandchild in descendants(child)]


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


def spinn_processes(root: int) -> list[int]:
    """The `spinn` commands running below process `root`."""
    name = f"/{SPINN_COMMAND.name}"
    return [pid for pid in descendants(root) if any(word.endswith(name) for word in command_line(pid))]


def kill_if_running(pids: list[int]) -> None:
    """End what a failed test left running, by id (a process ended meanwhile is skipped)."""
    for pid in pids:
        if running(pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def run_statuses(uri: str) -> list[str]:
    """The status of every run in the store, whatever its experiment."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    return [run.info.status for run in client.search_runs(experiments)]


def smoke_pairs(smoke_model, count: int) -> list[dict]:
    """The first `count` smoke test pairs as plain rows (id, premise, hypothesis, gold label)."""
    table = pq.read_table(smoke_model.prepared / "test.parquet", columns=["pair_id", "premise", "hypothesis", "label"])
    return [
        {"id": row["pair_id"], "premise": row["premise"], "hypothesis": row["hypothesis"], "label": row["label"]}
        for row in table.to_pylist()[:count]
    ]


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` as a CSV, JSONL or (any other suffix) Parquet file."""
    if path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def stop_before_the_merge(monkeypatch) -> None:
    """The next label runs stop once every shard is labelled, before their merge publishes anything: the parts
    folder keeps the plan and every shard, as a run killed at that moment leaves it."""
    import spinn.labeling.label as label_module
    from spinn.ground.errors import SpinnError

    def stopped(*args, **kwargs):
        raise SpinnError("stopped before the merge")

    monkeypatch.setattr(label_module, "merge_shards", stopped)


def damage_shard(parts: Path, damage: str, index: int) -> str:
    """Damage shard `index`'s files in a label run's parts folder as DAMAGES names; returns the name of the
    file a resume must name as damaged."""
    labels, rejects = parts / f"labels-{index:05d}.parquet", parts / f"labels-{index:05d}.rejects.jsonl"
    pairs, input_rejects = parts / f"input-{index:05d}.parquet", parts / f"input-{index:05d}.rejects.jsonl"
    if damage == "labels truncated":
        labels.write_bytes(labels.read_bytes()[: labels.stat().st_size // 2])
    elif damage == "a row twice":
        table = pq.read_table(labels)
        pq.write_table(pa.concat_tables([table, table.slice(0, 2)]), labels)
    elif damage == "a row missing":
        pq.write_table(pq.read_table(labels).slice(1), labels)
    elif damage == "label rejects not JSON":
        rejects.write_text("{\n", encoding="utf-8")
    elif damage == "input deleted":
        pairs.unlink()
        return pairs.name
    elif damage == "input truncated":
        pairs.write_bytes(pairs.read_bytes()[:100])
        return pairs.name
    elif damage == "input rejects not JSON":
        input_rejects.write_text("not json\n", encoding="utf-8")
        return pairs.name
    elif damage == "plan not JSON":
        (parts / "plan.json").write_text("{", encoding="utf-8")
        return "plan.json"
    else:
        raise ValueError(damage)
    return labels.name


DAMAGES = (
    "labels truncated",
    "a row twice",
    "a row missing",
    "label rejects not JSON",
    "input deleted",
    "input truncated",
    "input rejects not JSON",
    "plan not JSON",
)
"""What a kill, a full disk or a person leaves in a parts folder, which a resume must repair."""


def run_table(state) -> dict[str, dict]:
    """File name -> its row in the labelling-run table artifact that this label-pairs flow run created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["spinn-labeling-run"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]),
            )
        )
    assert [artifact.type for artifact in artifacts] == ["table"]
    return {row["file"]: row for row in json.loads(artifacts[0].data)}


def file_runs(state) -> dict[str, object]:
    """Each label-file subflow run of this label-pairs run, by its name (`label-<file>`), from Prefect."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    parent = FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])
    with get_client(sync_client=True) as client:
        return {
            run.name: run for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=parent))
        }


# ----------------------------------------------------------------------------- gold label schemes

SCHEME_PAIRS = [
    ("A cat is swimming.", "A happy cat is swimming.", "neutral"),
    ("A cat is swimming.", "An animal is swimming.", "entailment"),
    ("A cat is swimming.", "A cat is sleeping.", "contradiction"),
    ("A little boy is playing a piano.", "A little boy is playing an instrument.", "entailment"),
    ("A little boy is playing a piano.", "A little boy is riding a bicycle.", "contradiction"),
    ("A young man is jumping.", "A man is moving.", "entailment"),
    ("A young man is jumping.", "A young man is jumping in the field.", "neutral"),
    ("A woman is swimming in the field.", "A person is moving in the field.", "entailment"),
]
"""Hand-written pairs and their three-way meaning; each scheme's file says it in its own two classes."""


def glue_file(folder: Path) -> Path:
    """GLUE's RTE layout: TSV with `index`, sentence1, sentence2, label (entailment / not_entailment)."""
    rows = [
        f"{i}\t{p}\t{h}\t{'entailment' if g == 'entailment' else 'not_entailment'}"
        for i, (p, h, g) in enumerate(SCHEME_PAIRS)
    ]
    path = folder / "rte.tsv"
    path.write_text("index\tsentence1\tsentence2\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def hans_file(folder: Path) -> Path:
    """HANS's layout: TSV with gold_label first (entailment / non-entailment) and a pairID column."""
    rows = [
        f"{'entailment' if g == 'entailment' else 'non-entailment'}\t{p}\t{h}\tex{i}"
        for i, (p, h, g) in enumerate(SCHEME_PAIRS)
    ]
    path = folder / "hans.tsv"
    path.write_text("gold_label\tsentence1\tsentence2\tpairID\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def scitail_file(folder: Path) -> Path:
    """SciTail's JSON lines: sentence1, sentence2, gold_label (entails / neutral)."""
    rows = [
        {"sentence1": p, "sentence2": h, "gold_label": "entails" if g == "entailment" else "neutral"}
        for p, h, g in SCHEME_PAIRS
    ]
    path = folder / "scitail.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


SCHEME_FILES = {"glue": glue_file, "hans": hans_file, "scitail": scitail_file}


def hand_count(output: Path) -> float:
    """Accuracy in a two-way scheme counted by hand: the model is right when it says entailment exactly where
    the pair's meaning is entailment."""
    predicted = pq.read_table(output, columns=["row", "label"]).to_pylist()
    right = sum(
        (row["label"] == "entailment") == (SCHEME_PAIRS[row["row"] - 1][2] == "entailment") for row in predicted
    )
    return right / len(SCHEME_PAIRS)


# ----------------------------------------------------------------------------- the thread rule's trace

FREE_CORES_SEEN = 1.0
"""The free-core reading the thread-rule checks stub: auto then runs one thread on any machine."""


def thread_rule_env(trace: Path) -> dict[str, str]:
    """The variables that make every spinn process write its thread decisions to `trace`, under a stubbed
    free-core reading (spinn/ground/cores.py)."""
    return {cores.TRACE_VARIABLE: str(trace), cores.FREE_CORES_VARIABLE: str(FREE_CORES_SEEN)}


def thread_decisions(trace: Path, where: str) -> list[dict]:
    """The decisions the trace holds for `where` (a stage: train, evaluate, label, ...), in order."""
    lines = trace.read_text(encoding="utf-8").splitlines() if trace.exists() else []
    return [decision for decision in map(json.loads, lines) if decision["where"] == where]


def assert_the_thread_rule_ran(decision: dict, *, in_child: bool = True) -> None:
    """One traced decision is the rule's for an auto setting under the stubbed reading: the free cores rounded,
    within the process's share, and OpenMP's wait as this test process has it (every child inherits it; a
    child that loaded spinn before torch had it in place for torch's OpenMP runtime)."""
    assert decision["asked"] == cores.AUTO, decision
    assert decision["free"] == FREE_CORES_SEEN, decision
    assert decision["threads"] == min(decision["share"], round(FREE_CORES_SEEN)) == 1, decision
    assert decision["openmp"] == {name: os.environ.get(name) for name in cores.OPENMP_WAIT_VARIABLES}, decision
    if in_child:
        assert decision["pid"] != os.getpid() and decision["torch_loaded_first"] is False, decision


# ----------------------------------------------------------------------------- tiny models, synthetic batches

TOLERANCE = 1e-10
"""float64: two encoders of the same arithmetic differ only in the order of their sums."""
TINY = {"d_embed": TINY_EMBED, **TINY_MODEL, "use_batch_norm": True}
"""TINY_MODEL as SPINNConfig's fields, with random vectors' width and batch norm on: what the model tests build."""
CASES = [(variant, source) for variant in TREE_VARIANTS for source in SPINNConfig(variant=variant, **TINY).sources]
"""Every tree variant with every transition source it can run."""
CASE_IDS = [f"{variant}-{source.value}" for variant, source in CASES]


def random_transitions(rng: random.Random, words: int) -> tuple[int, ...]:
    """A valid shift/reduce sequence of 2n - 1 steps over n words: a random binary tree."""
    sequence, depth, shifted = [], 0, 0
    while len(sequence) < 2 * words - 1:
        if shifted < words and (depth < 2 or rng.random() < 0.5):
            sequence.append(SHIFT)
            depth, shifted = depth + 1, shifted + 1
        else:
            sequence.append(REDUCE)
            depth -= 1
    return tuple(sequence)


def synthetic_batch(pairs: int = 10, vocab_size: int = 30, longest: int = 9, seed: int = 0) -> tuple[Batch, int]:
    """A seeded batch of pairs with random lengths (1 to `longest` words), ids, trees and labels, and the
    vocabulary size."""
    rng = random.Random(seed)

    def sentence() -> tuple[tuple[int, ...], tuple[int, ...]]:
        words = rng.randint(1, longest)
        return tuple(rng.randrange(2, vocab_size) for _ in range(words)), random_transitions(rng, words)

    examples = [Example(*sentence(), *sentence(), rng.randrange(3)) for _ in range(pairs)]
    return make_batch(examples), vocab_size


TINY_WORDS = ("<pad>", "<unk>", "a", "dog", "runs", "cat", "sleeps", ".")
"""The vocabulary of an untrained checkpoint: enough for "A dog runs." and "A cat sleeps."."""


def untrained_checkpoint(config: SPINNConfig, step: int = 0) -> Checkpoint:
    """A checkpoint of an untrained model of `config` over TINY_WORDS (random vectors), for tests that need a
    model file, not what it learned."""
    vocabulary = Vocabulary(TINY_WORDS, (0,) * len(TINY_WORDS), True, 1).to_json()
    model = SPINN(config, random_vectors(len(TINY_WORDS), config.d_embed))
    return Checkpoint(model.state_dict(), config.to_dict(), vocabulary, step)


def tiny_model(variant: str, vocab_size: int, **config) -> SPINN:
    """A float64 model of TINY's sizes, seeded, in training mode."""
    torch.manual_seed(0)
    settings = {**TINY, **config}
    return SPINN(SPINNConfig(variant=variant, **settings), random_vectors(vocab_size, settings["d_embed"])).double()


def uniforms_for(batch: Batch, source: TransitionSource) -> torch.Tensor | None:
    """Fixed uniform draws for a sampled run (None for the other sources)."""
    if source is not TransitionSource.SAMPLED:
        return None
    generator = torch.Generator().manual_seed(1)
    return draw_uniforms(batch.tokens.shape[0], batch.transitions.shape[1], batch.tokens.device, generator)


def dev_batch(snli_dev: Path, pairs: int = 24) -> tuple[Batch, int]:
    """A batch of the first real SNLI dev pairs (mixed lengths), and the size of their vocabulary."""
    raw = read_raw_pairs(snli_dev)[:pairs]
    vocabulary = corpus_vocabulary(raw)
    return make_batch(encode_pairs(raw, vocabulary)), len(vocabulary)
