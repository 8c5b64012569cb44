"""The one inference path: predict() and its step and graph plumbing; evaluate, label and trees agree through it.

Everything runs on a CPU; the CUDA graph capture itself needs a GPU (scripts/gpu_check.sh).
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest
import torch

from spinn.bench import load_examples
from spinn.data.pairs import encode_pairs, read_raw_pairs
from spinn.data.schema import LABELS
from spinn.ground.errors import SpinnError
from spinn.inference.graphs import clone_batch, copy_into, refusal, shape_key, shape_report
from spinn.inference.infer_step import InferStep
from spinn.inference.predict import predict
from spinn.model.batch import make_batch
from spinn.model.config import SPINNConfig, TransitionSource
from spinn.model.loading import load_model
from spinn.model.spinn import SPINN, random_vectors, transition_counts
from spinn.trees.tokenize import tokenize
from spinn.trees.transitions import Transition, transition_count

CPU = torch.device("cpu")
TOLERANCE = 1e-5
AGREEMENT_PAIRS = 40

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_model(variant: str, vocab_size: int, d: int = 24) -> SPINN:
    torch.manual_seed(0)
    config = SPINNConfig(variant=variant, d_embed=d, d_hidden=d, d_tracker=8, use_batch_norm=True, mlp_dim=32)
    return SPINN(config, random_vectors(vocab_size, d, 0)).eval()


@pytest.fixture(scope="module")
def snli_examples(snli_dev):
    """64 real labelled SNLI dev pairs (with their parses) and the vocabulary size."""
    return load_examples(snli_dev, 64, 0, labelled=True)


def test_graph_inputs_are_keyed_by_shape_and_copied_in_place(snli_examples):
    examples, _ = snli_examples
    first = make_batch(examples[:8], width_step=64)
    second = make_batch(examples[8:16], width_step=64)
    other = make_batch(examples[:9], width_step=64)
    assert shape_key(first) == shape_key(second) != shape_key(other)
    static = clone_batch(first)
    buffers = [static.tokens.data_ptr(), static.plan.reads.data_ptr()]
    copy_into(static, second)
    assert [static.tokens.data_ptr(), static.plan.reads.data_ptr()] == buffers  # the graph's buffers stay
    assert torch.equal(static.tokens, second.tokens) and torch.equal(static.plan.reads, second.plan.reads)


def test_the_graph_report_says_what_became_of_every_shape():
    """Captured, refused with its reason, still warming up, or eager because MAX_GRAPHS were taken: a fallback
    always says why (the GPU check prints this for every step it captures)."""
    warm, captured, refused, over = ((((n, 4), torch.long), ((n, 7), torch.long), True) for n in (2, 3, 4, 5))
    seen = Counter({warm: 2, captured: 3, refused: 3, over: 9})
    reason = refusal(RuntimeError("operation not permitted when stream is capturing\nmore detail"))
    report = shape_report(seen, [captured], {refused: reason}, warmup=2, capture_seconds=0.5)
    assert report == {
        "shapes": 4,
        "captured": 1,
        "refused": [{"shape": [4, 4], "reason": "RuntimeError: operation not permitted when stream is capturing"}],
        "warming_up": 1,
        "over_limit": 1,
        "capture_seconds": 0.5,
    }
    assert refusal(RuntimeError()) == "RuntimeError"


def test_inference_step_equals_the_model(snli_examples):
    examples, vocab_size = snli_examples
    model = random_model("spinn", vocab_size)
    batch = make_batch(examples[:16])
    with torch.no_grad():
        expected = model(batch, source=TransitionSource.GREEDY)
    found = InferStep(model, TransitionSource.GREEDY)(batch)
    assert torch.equal(found.logits, expected.logits) and torch.equal(found.transitions, expected.transitions)


@pytest.mark.parametrize("source", [TransitionSource.GOLD, TransitionSource.GREEDY])
def test_predict_gives_each_pair_what_the_model_gives_it_alone_in_input_order(snli_examples, source):
    """Length-sorted batches of any size, read back once, equal the model run on each pair by itself."""
    examples, vocab_size = snli_examples
    examples = examples[:24]
    model = random_model("spinn", vocab_size)
    found = predict(model, examples, CPU, 5, source)
    assert predict(model, examples, CPU, 64, source).premise_transitions == found.premise_transitions
    for index in (0, 7, 23):
        with torch.no_grad():
            alone = model(make_batch([examples[index]]), source=source)
        expected = torch.softmax(alone.logits, dim=1)[0]  # (C,)
        assert torch.allclose(torch.from_numpy(found.probabilities[index]), expected, atol=TOLERANCE)
        assert found.labels[index] == int(expected.argmax())
    for example, premise, hypothesis in zip(
        examples, found.premise_transitions, found.hypothesis_transitions, strict=True
    ):
        for ran, words, parse in (
            (premise, example.premise, example.premise_transitions),
            (hypothesis, example.hypothesis, example.hypothesis_transitions),
        ):
            assert len(ran) == transition_count(len(words)) and ran.count(Transition.SHIFT) == len(words)
            if source is TransitionSource.GOLD:
                assert ran == parse
    assert 0.0 <= found.transition_accuracy <= 1.0


@pytest.mark.parametrize("source", [TransitionSource.GOLD, TransitionSource.GREEDY])
def test_predict_encodes_each_distinct_sentence_once_and_counts_it_for_every_pair(snli_examples, source):
    """SNLI repeats its premises: each distinct sentence goes through the encoder once, while transition
    accuracy and progress still count every pair, as one batch of all the pairs (no sharing) does."""
    examples, vocab_size = snli_examples
    examples = examples[:30] + examples[:6]  # six whole pairs again, besides premises SNLI itself repeats
    distinct = {(e.premise, e.premise_transitions) for e in examples} | {
        (e.hypothesis, e.hypothesis_transitions) for e in examples
    }
    assert len(distinct) <= 2 * len(examples) - 12
    model = random_model("spinn", vocab_size)
    step, encoded, progress = InferStep(model, source), [], []
    encode = step.encode
    step.encode = lambda batch: encoded.append(batch.tokens.shape[0]) or encode(batch)
    found = predict(model, examples, CPU, 4, source, step=step, on_batch=progress.append)
    assert sum(encoded) == len(distinct) and max(encoded) <= 2 * 4
    assert sum(progress) == len(examples) and min(progress) > 0
    batch = make_batch(examples)
    with torch.no_grad():
        whole = model(batch, source=source)
    steps, agreeing = transition_counts(whole.transition_logits, batch.transitions).sum(0).tolist()
    assert (found.transition_steps, found.transition_agreement) == (steps, agreeing)
    assert steps == (sum(len(e.premise_transitions) + len(e.hypothesis_transitions) for e in examples))
    expected = torch.softmax(whole.logits, dim=1)  # (P, C)
    assert torch.allclose(torch.from_numpy(found.probabilities), expected, atol=TOLERANCE)


def test_predict_restores_training_mode_and_refuses_a_step_of_another_source(snli_examples):
    examples, vocab_size = snli_examples
    model = random_model("spinn", vocab_size).train()
    predict(model, examples[:4], CPU, 2, TransitionSource.GOLD)
    assert model.training
    with pytest.raises(SpinnError, match="greedy"):
        predict(model, examples[:4], CPU, 2, TransitionSource.GOLD, step=InferStep(model, TransitionSource.GREEDY))
    with pytest.raises(SpinnError, match="sampled"):
        InferStep(model, TransitionSource.SAMPLED)


def test_evaluate_label_and_trees_agree_on_the_same_pairs(smoke_model, tmp_path):
    """The three commands that run a trained model give the same labels and the same trees, pair by pair."""
    from spinn.evaluation.evaluate import predict_examples
    from spinn.labeling.induced_trees import TreesSettings, induce_trees
    from spinn.labeling.label import label
    from spinn.labeling.label_settings import LabelSettings

    loaded = load_model(smoke_model.checkpoint, CPU)
    raw = [pair for pair in read_raw_pairs(smoke_model.prepared / "test.parquet") if pair.label is not None]
    raw = raw[:AGREEMENT_PAIRS]
    texts = [(" ".join(pair.premise), " ".join(pair.hypothesis)) for pair in raw]
    assert all(tokenize(text) == list(pair.premise) for (text, _), pair in zip(texts, raw, strict=True))

    scored = predict_examples(
        loaded.model, encode_pairs(raw, loaded.vocabulary), CPU, source=TransitionSource.GREEDY, batch_size=7
    )
    source = tmp_path / "pairs.jsonl"
    source.write_text(
        "".join(json.dumps({"id": f"p{i}", "premise": p, "hypothesis": h}) + "\n" for i, (p, h) in enumerate(texts)),
        encoding="utf-8",
    )
    label(source, smoke_model.checkpoint, tmp_path / "out.parquet", LabelSettings(parser="model", device="cpu"))
    labelled = pq.read_table(tmp_path / "out.parquet").to_pylist()
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(f"{p}\n{h}\n" for p, h in texts), encoding="utf-8")
    induce_trees(smoke_model.checkpoint, sentences, tmp_path / "trees.txt", TreesSettings(batch_size=9, device="cpu"))
    drawn = (tmp_path / "trees.txt").read_text(encoding="utf-8").splitlines()

    assert [row["label"] for row in labelled] == [LABELS[index] for index in scored.predicted]
    assert drawn == [tree for row in labelled for tree in (row["premise_tree"], row["hypothesis_tree"])]
    assert len(set(drawn)) > 1  # real trees over real sentences, not one constant
