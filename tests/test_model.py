"""Tests for spinn.model (and spinn.bench.reference): the batched encoder is exactly the tree recursion."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from spinn.bench.reference import ReferenceSPINN
from spinn.data.example import Example
from spinn.data.pairs import corpus_vocabulary, encode_pairs, read_raw_pairs
from spinn.ground.errors import SpinnError
from spinn.model.addressing import WORD_BASE, ZERO_ROW, gold_plan
from spinn.model.batch import Batch, make_batch
from spinn.model.config import TREE_VARIANTS, EncoderLoop, SPINNConfig, TransitionSource
from spinn.model.presets import PRESETS
from spinn.model.spinn import SPINN, random_vectors, spinn_loss, transition_counts
from spinn.trees.transitions import (
    PAD_TRANSITION,
    Transition,
    check_transitions,
    read_binary_parse,
    transitions_to_tree,
)
from spinn.trees.tree import Tree
from tests.helpers import TINY

GOLD = TransitionSource.GOLD

FLOAT32_TOLERANCE = 1e-5
FLOAT64_TOLERANCE = 1e-10
CONFIG = SPINNConfig(variant="spinn", **TINY)
TINY_TREES = [("( ( a b ) c )", "( d e )"), ("a", "( b ( c ( d a ) ) )"), ("( ( b c ) ( d e ) )", "c")]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def snli(snli_dev):
    """The first 400 real dev pairs, encoded, and their vocabulary size."""
    pairs = read_raw_pairs(snli_dev)[:400]
    vocabulary = corpus_vocabulary(pairs)
    return pairs, encode_pairs(pairs, vocabulary), vocabulary


@pytest.fixture(scope="module")
def mixed(snli):
    """Twelve real pairs of mixed lengths: the longest, the shortest and some in between."""
    _, examples, _ = snli
    by_length = sorted(range(len(examples)), key=lambda i: (examples[i].length, i))
    chosen = by_length[:3] + by_length[-3:] + by_length[100:400:50]
    return [examples[i] for i in chosen]


def build(config: SPINNConfig, vocab_size: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> SPINN:
    """A model in eval mode with non-trivial batch-norm statistics."""
    torch.manual_seed(seed)
    model = SPINN(config, random_vectors(vocab_size, config.d_embed, seed)).to(dtype)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def tiny_examples(trees=TINY_TREES) -> tuple[list[Example], int]:
    words = {"a": 2, "b": 3, "c": 4, "d": 5, "e": 6}
    examples = []
    for label, (premise, hypothesis) in enumerate(trees):
        p_tokens, p_transitions = read_binary_parse(premise)
        h_tokens, h_transitions = read_binary_parse(hypothesis)
        examples.append(
            Example(
                tuple(words[t] for t in p_tokens),
                tuple(p_transitions),
                tuple(words[t] for t in h_tokens),
                tuple(h_transitions),
                label % 3,
            )
        )
    return examples, len(words) + 2


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    difference = (actual - expected).abs().max().item()
    assert difference <= tolerance, f"max difference {difference:.3g} > {tolerance:.1g}"


# ----------------------------------------------------------------------------- config


def test_presets_hold_the_paper_settings():
    for variant in ("pi-nt", "pi", "spinn"):
        config = PRESETS[variant].model
        assert (config.d_hidden, config.d_embed, config.mlp_dim) == (300, 300, 1024)
    assert all(preset.model.variant == variant for variant, preset in PRESETS.items())
    assert set(PRESETS) == set(TREE_VARIANTS) | {"cbow"}
    assert 61 <= PRESETS["pi"].model.d_tracker <= 79 and 61 <= PRESETS["spinn"].model.d_tracker <= 79
    assert PRESETS["spinn"].model.transition_loss_weight == 3.9 and PRESETS["rl"].model.transition_loss_weight == 0


def test_config_round_trip_and_validation():
    config = PRESETS["spinn"].model
    assert SPINNConfig.from_dict(config.to_dict()) == config
    with pytest.raises(SpinnError, match="heads: unknown setting"):
        SPINNConfig.from_dict({**config.to_dict(), "heads": 2})
    for bad in (
        {"variant": "rnn"},
        {"reward": "accuracy"},
        {"baseline": "none"},
        {"baseline_decay": 1.0},
        {"d_hidden": 0},
        {"variant": "pi", "d_tracker": 0},
        {"embed_dropout": 1.0},
        {"mlp_layers": -1},
    ):
        with pytest.raises(SpinnError):
            SPINNConfig.build(bad)
    assert SPINNConfig(variant="pi-nt", d_tracker=0).has_tracker is False


def test_embedding_matrix_shape_is_checked():
    with pytest.raises(SpinnError, match="embedding matrix"):
        SPINN(CONFIG, torch.zeros(10, CONFIG.d_embed + 1))


def test_evaluation_folds_batch_norm_into_the_word_projection():
    """In eval mode the word projection and its batch norm are one GEMM: the same (W, 2D) as normalizing the
    projection with the running statistics, which training moved away from 0 and 1."""
    torch.manual_seed(0)
    model = SPINN(CONFIG, random_vectors(30, CONFIG.d_embed)).double()
    embedding = model.embedding
    tokens = torch.randint(0, 30, (40,))
    for _ in range(3):  # training moves the running statistics and the affine parameters off their start
        embedding(tokens).sum().backward()
        with torch.no_grad():
            for parameter in (embedding.norm.weight, embedding.norm.bias, embedding.project.bias):
                parameter.add_(torch.randn_like(parameter))
    embedding.eval()
    expected = torch.nn.functional.batch_norm(
        embedding.project(embedding.vectors(tokens)),
        embedding.norm.running_mean,
        embedding.norm.running_var,
        embedding.norm.weight,
        embedding.norm.bias,
        eps=embedding.norm.eps,
    )  # (40, 2D)
    assert not torch.allclose(expected, embedding.project(embedding.vectors(tokens)))
    torch.testing.assert_close(embedding(tokens), expected, rtol=1e-12, atol=1e-12)


def test_only_spinn_predicts_transitions():
    examples, vocab_size = tiny_examples()
    model = build(CONFIG.replace(variant="pi"), vocab_size)
    with pytest.raises(SpinnError, match="cannot run on greedy transitions"):
        model(make_batch(examples), source=TransitionSource.GREEDY)


# ----------------------------------------------------------------------------- batched = one by one


def encode_alone(model: SPINN, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    outputs = [model(make_batch([e]), source=GOLD) for e in examples]
    return (
        torch.cat([o.logits for o in outputs]),
        torch.cat([o.premise for o in outputs]),
        torch.cat([o.hypothesis for o in outputs]),
    )


@pytest.mark.parametrize("variant", TREE_VARIANTS)
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, FLOAT32_TOLERANCE), (torch.float64, FLOAT64_TOLERANCE)])
def test_batch_equals_examples_one_by_one(snli, mixed, variant, dtype, tolerance):
    model = build(CONFIG.replace(variant=variant), len(snli[2]), dtype)
    batch = make_batch(mixed)
    assert len(set(batch.lengths.tolist())) > 8, "the batch should mix many sentence lengths"
    with torch.no_grad():
        together = model(batch, source=GOLD)
        logits, premise, hypothesis = encode_alone(model, mixed)
    assert_close(together.premise, premise, tolerance)
    assert_close(together.hypothesis, hypothesis, tolerance)
    assert_close(together.logits, logits, tolerance)


@pytest.mark.parametrize("variant", TREE_VARIANTS)
def test_padding_to_a_bucket_width_changes_nothing(snli, mixed, variant):
    """Extra word slots and steps (shape buckets for CUDA graphs) compute unused rows: outputs and gradients stay."""
    model = build(SPINNConfig(**{**CONFIG.to_dict(), "variant": variant}), len(snli[2]), torch.float64).train()
    exact, padded = make_batch(mixed), make_batch(mixed, width_step=16)
    assert padded.tokens.shape[1] > exact.tokens.shape[1]
    draws = {"uniforms": torch.rand(*padded.transitions.shape, dtype=torch.float64)} if variant == "rl" else {}
    outputs, grads = [], []
    for batch in (exact, padded):
        uniforms = {key: value[:, : batch.transitions.shape[1]] for key, value in draws.items()}
        output = model(batch, source=model.config.training_source, **uniforms)
        parameters = [p for p in model.parameters() if p.requires_grad]
        grads.append(torch.autograd.grad(spinn_loss(output, batch, model.config).total, parameters))
        outputs.append(output)
    assert_close(outputs[0].logits, outputs[1].logits, FLOAT64_TOLERANCE)
    for first, second in zip(*grads, strict=True):
        assert_close(first, second, FLOAT64_TOLERANCE)


def recursive_encode(model: SPINN, tree: Tree, ids: dict[str, int]) -> torch.Tensor:
    """The tree recursion, written from the equations with nothing from spinn.model but its weights."""
    d = model.config.d_hidden
    vectors = model.embedding.vectors.weight
    project, compose = model.embedding.project, model.encoder.reduce.compose

    def walk(node: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        if node.is_leaf:
            state = project.weight @ vectors[ids[node.label]] + project.bias
            return state[:d], state[d:]
        (h_left, c_left), (h_right, c_right) = (walk(child) for child in node.children)
        a, i, f_left, f_right, o = (compose.weight @ torch.cat([h_left, h_right]) + compose.bias).chunk(5)
        c = torch.tanh(a) * torch.sigmoid(i) + torch.sigmoid(f_left) * c_left + torch.sigmoid(f_right) * c_right
        return torch.sigmoid(o) * torch.tanh(c), c

    return walk(tree)[0]


def test_pi_nt_matches_a_simple_tree_recursion(snli):
    pairs, examples, vocabulary = snli
    config = CONFIG.replace(variant="pi-nt", d_tracker=0, use_batch_norm=False)
    model = build(config, len(vocabulary), torch.float64)
    chosen = list(range(0, 400, 20))
    with torch.no_grad():
        output = model(make_batch([examples[i] for i in chosen]), source=GOLD)
        for row, i in enumerate(chosen):
            for tokens, transitions, encoded in (
                (pairs[i].premise, pairs[i].premise_transitions, output.premise),
                (pairs[i].hypothesis, pairs[i].hypothesis_transitions, output.hypothesis),
            ):
                tree = transitions_to_tree(tokens, transitions)
                ids = dict(zip(tokens, vocabulary.encode(list(tokens)), strict=True))
                expected = recursive_encode(model, tree, ids)
                assert_close(encoded[row], expected, FLOAT64_TOLERANCE)


@pytest.mark.parametrize("variant", TREE_VARIANTS)
def test_seed_article_reference_gives_the_same_outputs_and_gradients(snli, mixed, variant):
    config = CONFIG.replace(variant=variant, use_batch_norm=False)
    model = build(config, len(snli[2]), torch.float64)
    reference = ReferenceSPINN(model)
    batch = make_batch(mixed)
    fast_out, reference_out = model(batch, source=GOLD), reference(batch, source=GOLD)
    assert_close(fast_out.logits, reference_out.logits, FLOAT64_TOLERANCE)
    assert_close(fast_out.premise, reference_out.premise, FLOAT64_TOLERANCE)
    if variant == "spinn":
        assert torch.equal(fast_out.transition_logits.isinf(), reference_out.transition_logits.isinf())
        finite = fast_out.transition_logits.isfinite()
        assert_close(fast_out.transition_logits[finite], reference_out.transition_logits[finite], FLOAT64_TOLERANCE)
    parameters = [p for p in model.parameters() if p.requires_grad]
    fast_grads = torch.autograd.grad(spinn_loss(fast_out, batch, config).total, parameters)
    reference_grads = torch.autograd.grad(spinn_loss(reference_out, batch, config).total, parameters)
    for fast_grad, reference_grad in zip(fast_grads, reference_grads, strict=True):
        assert_close(fast_grad, reference_grad, FLOAT64_TOLERANCE)


def test_inference_path_equals_the_autograd_path():
    """The CPU inference loop computes only the rows that are read (thin_stack_infer), without autograd:
    the numbers change only by float64 rounding of other GEMM shapes."""
    examples, vocab_size = tiny_examples()
    model = build(CONFIG, vocab_size, torch.float64)
    batch = make_batch(examples)
    with torch.inference_mode():
        inferred = model(batch, source=GOLD, loop=EncoderLoop.CPU_INFERENCE)
    tracked = model(batch, source=GOLD)
    assert tracked.logits.requires_grad
    assert torch.allclose(inferred.logits, tracked.logits.detach(), rtol=0, atol=1e-12)
    assert torch.allclose(inferred.transition_logits, tracked.transition_logits.detach(), rtol=0, atol=1e-12)


def test_a_plan_refuses_transitions_that_are_not_a_tree():
    import numpy as np

    reduce_first = np.array([[Transition.REDUCE, Transition.SHIFT, Transition.SHIFT]])
    with pytest.raises(SpinnError, match="illegal transition at step 0"):
        gold_plan(reduce_first, np.array([2]), 2)


def test_a_plan_gives_each_reduce_and_only_each_reduce_a_compact_node_row():
    """Two sentences, three words ((a b) c) and two (a b), padded to three: step 2 makes both short trees'
    nodes, step 4 the long one's root; the compact rows are those three, in step order."""
    import numpy as np

    shift, reduce, pad = Transition.SHIFT, Transition.REDUCE, PAD_TRANSITION
    transitions = np.array([[shift, shift, reduce, shift, reduce], [shift, shift, reduce, pad, pad]])
    plan = gold_plan(transitions, np.array([3, 2]), 3)
    compact, node_base = plan.compact, WORD_BASE + 2 * 3
    word = [[WORD_BASE + sentence * 3 + position for position in range(3)] for sentence in range(2)]
    assert compact.counts == [0, 0, 2, 0, 1] and compact.rows == node_base + 3
    assert compact.reducers.tolist() == [0, 1, 0]
    assert compact.children.tolist() == [word[0][:2], word[1][:2], [node_base, word[0][2]]]
    assert compact.roots.tolist() == [node_base + 2, node_base + 1]
    assert compact.reads[3, 0].tolist() == [word[0][2], ZERO_ROW, node_base]  # buffer c; the stack: (a b)
    assert plan.to("cpu").compact is compact and plan.to("meta").compact is None  # the GPU's loop has no use


def test_reference_runs_on_gold_transitions_only():
    examples, vocab_size = tiny_examples()
    with pytest.raises(SpinnError, match="gold transitions only"):
        ReferenceSPINN(build(CONFIG, vocab_size))(make_batch(examples), source=TransitionSource.GREEDY)


# ----------------------------------------------------------------------------- gradients and training


@pytest.mark.parametrize("variant", TREE_VARIANTS)
def test_every_trainable_parameter_gets_a_gradient(variant):
    examples, vocab_size = tiny_examples()
    config = CONFIG.replace(variant=variant, embed_dropout=0.1, mlp_dropout=0.1)
    model = build(config, vocab_size).train()
    batch = make_batch(examples)
    spinn_loss(model(batch, source=config.training_source), batch, config).total.backward()
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    assert not model.embedding.vectors.weight.requires_grad


@pytest.mark.parametrize("variant", TREE_VARIANTS)
def test_gradcheck_float64(variant):
    examples, vocab_size = tiny_examples()
    # rl: the REINFORCE surrogate holds the reward fixed (detached), so finite differences of it are not its
    # gradient; its own test checks it (tests/test_policy.py). Here: the sampled trees' exact gradients.
    # Smaller than helpers' TINY: gradcheck runs two forwards for every parameter element.
    config = SPINNConfig(
        variant=variant,
        d_embed=3,
        d_hidden=2,
        d_tracker=2,
        mlp_dim=3,
        use_batch_norm=True,
        policy_weight=0.0,
    )
    model = build(config, vocab_size, torch.float64).train()
    batch = make_batch(examples)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    inputs = tuple(p.detach().clone().requires_grad_() for p in model.parameters() if p.requires_grad)

    # rl samples its trees: fixed draws make the loss a deterministic function of the parameters.
    draws = (
        {
            "uniforms": torch.rand(
                batch.tokens.shape[0],
                batch.transitions.shape[1],
                dtype=torch.float64,
                generator=torch.Generator().manual_seed(0),
            )
        }
        if variant == "rl"
        else {}
    )

    def loss(*parameters: torch.Tensor) -> torch.Tensor:
        weights = dict(zip(names, parameters, strict=True))
        output = functional_call(model, weights, (batch,), {"source": config.training_source, **draws})
        return spinn_loss(output, batch, config).total

    assert torch.autograd.gradcheck(loss, inputs)


def test_repeated_backward_through_one_graph():
    """The thin stack keeps its gradient in a shared buffer; a second pass must not see the first."""
    examples, vocab_size = tiny_examples()
    model = build(CONFIG, vocab_size, torch.float64)
    batch = make_batch(examples)
    loss = spinn_loss(model(batch, source=GOLD), batch, CONFIG).total
    weight = model.encoder.reduce.compose.weight
    (first,) = torch.autograd.grad(loss, [weight], retain_graph=True)
    (second,) = torch.autograd.grad(loss, [weight])
    assert torch.equal(first, second)


def test_overfits_sixteen_real_pairs(snli):
    _, examples, vocabulary = snli
    # wider than helpers' TINY: enough capacity to memorise sixteen real pairs in a few steps
    config = SPINNConfig(variant="spinn", d_embed=32, d_hidden=32, d_tracker=16, mlp_dim=64)
    model = build(config, len(vocabulary)).train()
    batch = make_batch(examples[:16])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(300):
        optimizer.zero_grad()
        output = model(batch, source=GOLD)
        spinn_loss(output, batch, config).total.backward()
        optimizer.step()
        if (output.logits.argmax(1) == batch.labels).all():
            break
    with torch.no_grad():
        accuracy = (model.eval()(batch, source=GOLD).logits.argmax(1) == batch.labels).float().mean().item()
    assert accuracy == 1.0


def test_frozen_embeddings_stay_put_under_training():
    examples, vocab_size = tiny_examples()
    model = build(CONFIG, vocab_size).train()
    before = model.embedding.vectors.weight.clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    batch = make_batch(examples)
    spinn_loss(model(batch, source=GOLD), batch, CONFIG).total.backward()
    optimizer.step()
    assert torch.equal(model.embedding.vectors.weight, before)


# ----------------------------------------------------------------------------- the spinn variant


def test_transition_loss_is_weighted_and_ignores_padding():
    examples, vocab_size = tiny_examples()
    model = build(CONFIG, vocab_size)
    batch = make_batch(examples)
    output = model(batch, source=GOLD)
    loss = spinn_loss(output, batch, CONFIG)
    assert loss.total.item() == pytest.approx(loss.classification.item() + 3.9 * loss.transition.item())
    padding = batch.transitions == PAD_TRANSITION
    assert (output.transition_logits[padding] == 0).all()
    assert output.transition_logits[~padding].isfinite().any(-1).all()
    steps, correct = transition_counts(output.transition_logits, batch.transitions).sum(0).tolist()
    assert steps == int((~padding).sum()) and 0 <= correct <= steps


def test_illegal_actions_are_masked_where_they_are_illegal():
    examples, vocab_size = tiny_examples()
    model = build(CONFIG, vocab_size)
    batch = make_batch(examples)
    logits = model(batch, source=GOLD).transition_logits
    for row in range(batch.tokens.shape[0]):
        stack, buffer = 0, int(batch.lengths[row])
        for step, value in enumerate(batch.transitions[row].tolist()):
            if value == PAD_TRANSITION:
                continue
            for action in Transition:
                assert logits[row, step, action].isinf().item() == (not action.is_legal(stack, buffer))
            stack, buffer = (stack + 1, buffer - 1) if value == Transition.SHIFT else (stack - 1, buffer)


def test_spinn_on_gold_transitions_encodes_like_pi(snli, mixed):
    pi = build(CONFIG.replace(variant="pi"), len(snli[2]), torch.float64)
    spinn = build(CONFIG, len(snli[2]), torch.float64)
    missing, unexpected = spinn.load_state_dict(pi.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("encoder.tracker.transition.") for name in missing)
    batch = make_batch(mixed)
    with torch.no_grad():
        assert_close(spinn(batch, source=GOLD).logits, pi(batch, source=GOLD).logits, FLOAT64_TOLERANCE)


def test_predicted_transitions_fed_back_as_gold_give_the_same_encoding(snli, mixed):
    """The device-side stacks of the model's own choices address the memory as the host plan does."""
    model = build(CONFIG, len(snli[2]), torch.float64)
    batch = make_batch(mixed)
    with torch.no_grad():
        predicted = model(batch, source=TransitionSource.GREEDY)
        plan = gold_plan(predicted.transitions.numpy(), batch.lengths.numpy(), batch.tokens.shape[1])
        replayed = model(Batch(batch.tokens, batch.lengths, predicted.transitions, batch.labels, plan), source=GOLD)
    assert torch.equal(replayed.transitions, predicted.transitions)
    assert_close(replayed.logits, predicted.logits, FLOAT64_TOLERANCE)
    assert_close(replayed.premise, predicted.premise, FLOAT64_TOLERANCE)


@pytest.mark.parametrize("bias", [0.0, 8.0, -8.0])
def test_predicted_transitions_are_always_legal(snli, bias):
    """Random weights, pushed towards SHIFT or REDUCE: every row still builds one tree over all its words."""
    _, examples, vocabulary = snli
    model = build(CONFIG, len(vocabulary), seed=3)
    with torch.no_grad():
        model.encoder.tracker.transition.bias.copy_(torch.tensor([0.0, bias]))
        batch = make_batch(examples[:64])
        transitions = model(batch, source=TransitionSource.GREEDY).transitions
    steps = transitions.shape[1]
    assert steps == 2 * int(batch.lengths.max()) - 1
    seen = set()
    for row, length in enumerate(batch.lengths.tolist()):
        values = transitions[row].tolist()
        count = 2 * length - 1
        assert values[count:] == [PAD_TRANSITION] * (steps - count)
        check_transitions(values[:count], length)
        seen.add(tuple(values[:count]))
    assert len(seen) > 10, "predictions should differ across sentences"


# ----------------------------------------------------------------------------- GPU-oriented paths, run on CPU


def test_bf16_autocast_keeps_fp32_cell_state():
    examples, vocab_size = tiny_examples()
    model = build(CONFIG, vocab_size)
    batch = make_batch(examples)
    with torch.no_grad():
        exact = model(batch, source=GOLD)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed_precision = model(batch, source=GOLD)
    assert mixed_precision.premise.dtype == torch.float32
    assert_close(mixed_precision.premise, exact.premise, 0.05)


def test_cbow_is_the_mean_of_projected_word_vectors(snli, mixed):
    torch.manual_seed(0)
    model = SPINN(SPINNConfig(variant="cbow", **TINY), random_vectors(50, TINY["d_embed"])).eval()
    tokens = torch.tensor([[3, 4, 5], [6, 0, 0]])
    lengths = torch.tensor([3, 1])
    encoding = model.encode(tokens, lengths, GOLD)
    projected = model.embedding(torch.tensor([3, 4, 5, 6]))[:, : TINY["d_hidden"]]  # the h half
    assert torch.allclose(encoding.vectors[0], projected[:3].mean(0), atol=1e-6)
    assert torch.allclose(encoding.vectors[1], projected[3], atol=1e-6)
    assert encoding.transition_logits is None


def test_cbow_trains_every_parameter():
    torch.manual_seed(0)
    model = SPINN(SPINNConfig(variant="cbow", **TINY), random_vectors(50, TINY["d_embed"]))
    batch = make_batch([Example((3, 4), (0, 0, 1), (5,), (0,), 1), Example((6,), (0,), (7, 8), (0, 0, 1), 2)])
    spinn_loss(model(batch, source=GOLD), batch, model.config).total.backward()
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_training_steps_leave_no_graph_behind():
    """Each step's thin-stack tape must die with its graph; a reference cycle through
    autograd nodes once leaked ~1 MB per step on long runs."""
    import gc

    from spinn.model.thin_stack_forward import _Loop as _Memory

    torch.manual_seed(0)
    config = SPINNConfig(variant="spinn", **{**TINY, "use_batch_norm": False})  # one pair: batch norm needs two
    model = SPINN(config, random_vectors(50, TINY["d_embed"]))
    batch = make_batch([Example((3, 4, 5), (0, 0, 1, 0, 1), (6, 7), (0, 0, 1), 1)])
    gc.collect()
    before = sum(type(item) is _Memory for item in gc.get_objects())
    for _ in range(5):
        spinn_loss(model(batch, source=GOLD), batch, model.config).total.backward()
    gc.collect()
    assert sum(type(item) is _Memory for item in gc.get_objects()) == before
