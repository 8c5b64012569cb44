"""Shift/reduce transitions: the sequence a SPINN parser runs to build a binary tree.

SHIFT moves the next word from the buffer onto the stack; REDUCE pops the two
top phrases and pushes their composition. A binary tree over n words is exactly
its post-order walk: n SHIFTs and n - 1 REDUCEs, legal at every step (no REDUCE
with fewer than two phrases, no SHIFT from an empty buffer), ending with one
phrase on the stack. `tree_to_transitions` and `transitions_to_tree` are
inverses; the tests check the round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from spinn.ground.errors import SpinnError
from spinn.trees.tree import CLOSE, OPEN, Tree, TreeError, TreeProblem, node


class Transition(IntEnum):
    """A parser action; the integer is what Parquet stores (names in its metadata)."""

    SHIFT = 0
    REDUCE = 1

    def is_legal(self, stack_size: int, buffer_size: int) -> bool:
        """Whether this action can run with that many phrases stacked and words left."""
        if self is Transition.SHIFT:
            return buffer_size > 0
        return stack_size >= 2


TRANSITION_NAMES: dict[str, int] = {transition.name: transition.value for transition in Transition}
SHIFT: int = int(Transition.SHIFT)
REDUCE: int = int(Transition.REDUCE)
"""The actions as plain ints, for array comparisons (numpy and torch take them without an enum lookup)."""
PAD_TRANSITION: int = len(Transition)
"""The no-op a sentence takes after its own 2n - 1 steps, in padded batches only: never stored in Parquet,
so not a Transition; one past the real actions, so the tracker's (.., 2) logits never score it."""
REDUCE_ARITY = 2


class TransitionError(SpinnError):
    """A transition sequence that does not build exactly one tree over its words."""


def tree_to_transitions(tree: Tree) -> list[Transition]:
    """The post-order SHIFT/REDUCE sequence of a binary tree."""
    transitions: list[Transition] = []
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        current, children_done = stack.pop()
        if current.is_leaf:
            transitions.append(Transition.SHIFT)
        elif children_done:
            transitions.append(Transition.REDUCE)
        elif len(current.children) != REDUCE_ARITY:
            raise TransitionError(
                f"a node with {len(current.children)} children has no shift/reduce sequence; binarize first"
            )
        else:
            left, right = current.children
            stack.extend([(current, True), (right, False), (left, False)])
    return transitions


def read_binary_parse(text: str) -> tuple[list[str], list[int]]:
    """Tokens and transitions of an SNLI binary parse such as `( ( A dog ) ( runs . ) )`.

    The bracketing is already a post-order walk, so one scan emits SHIFT per
    word and REDUCE per closing bracket of two children, with no tree built:
    this is the hot loop of `spinn prepare`. A bracket with one child is
    collapsed into it; empty, unbalanced or over-full brackets raise TreeError.
    """
    tokens: list[str] = []
    transitions: list[int] = []
    children = [0]  # children seen so far in each open bracket; [0] is the top level
    for token in text.split():
        if token == OPEN:
            children.append(0)
        elif token == CLOSE:
            if len(children) == 1:
                raise TreeError(TreeProblem.UNBALANCED, "unbalanced parse: ')' without '('")
            count = children.pop()
            if count == 0:
                raise TreeError(TreeProblem.EMPTY, "empty brackets '( )'")
            if count > REDUCE_ARITY:
                raise TreeError(TreeProblem.MALFORMED, f"a bracket with {count} children in a binary parse")
            if count == REDUCE_ARITY:
                transitions.append(REDUCE)
            children[-1] += 1
        else:
            tokens.append(token)
            transitions.append(SHIFT)
            children[-1] += 1
    if len(children) > 1:
        raise TreeError(TreeProblem.UNBALANCED, f"unbalanced parse: {len(children) - 1} '(' left open")
    if children[0] == 0:
        raise TreeError(TreeProblem.EMPTY, "empty parse")
    if children[0] > 1:
        raise TreeError(TreeProblem.MALFORMED, f"{children[0]} trees where one was expected")
    return tokens, transitions


def parse_binary(text: str) -> Tree:
    """The Tree of an SNLI binary parse (see read_binary_parse for what is refused)."""
    return transitions_to_tree(*read_binary_parse(text))


def transitions_to_tree(tokens: Sequence[str], transitions: Sequence[int]) -> Tree:
    """Run the transitions over the tokens and return the one tree they build."""
    check_transitions(transitions, len(tokens))
    buffer = iter(tokens)
    stack: list[Tree] = []
    for transition in transitions:
        if transition == Transition.SHIFT:
            stack.append(Tree(next(buffer)))
        else:
            right = stack.pop()
            left = stack.pop()
            stack.append(node(left, right))
    return stack[0]


def format_transitions(tokens: Sequence[str], transitions: Sequence[int]) -> str:
    """`format_binary(transitions_to_tree(tokens, transitions))` without building the tree: the bracket
    string straight from the stack of phrases. Labelling writes two trees per pair, so this is on its
    hot path; the transitions must be legal (a model's own are: illegal actions are masked)."""
    buffer = iter(tokens)
    stack: list[str] = []
    for transition in transitions:
        if transition == SHIFT:
            stack.append(next(buffer))
        else:
            right = stack.pop()
            stack[-1] = f"{OPEN} {stack[-1]} {right} {CLOSE}"
    return stack[0]


def check_transitions(transitions: Sequence[int], n_tokens: int) -> None:
    """Raise TransitionError unless the sequence is legal and consumes all words into one root."""
    if n_tokens < 1:
        raise TransitionError("a sentence needs at least one token")
    stack_size = 0
    buffer_size = n_tokens
    for step, value in enumerate(transitions):
        try:
            transition = Transition(value)
        except ValueError:
            raise TransitionError(f"step {step}: {value!r} is not a transition") from None
        if not transition.is_legal(stack_size, buffer_size):
            raise TransitionError(
                f"step {step}: illegal {transition.name} with {stack_size} on the stack and {buffer_size} in the buffer"
            )
        if transition is Transition.SHIFT:
            stack_size += 1
            buffer_size -= 1
        else:
            stack_size -= 1
    if buffer_size or stack_size != 1:
        raise TransitionError(
            f"sequence ends with {buffer_size} words unread and {stack_size} phrases on the stack; expected 0 and 1"
        )


def transition_count(n_tokens: int) -> int:
    """A binary tree over n words takes n SHIFTs and n - 1 REDUCEs."""
    return 2 * n_tokens - 1


def constituent_spans(transitions: Sequence[int]) -> set[tuple[int, int]]:
    """Word spans [start, end) of the phrases a legal sequence builds, minus the trivial ones.

    Single words and the whole sentence are in every tree, so bracket F1
    leaves them out (as unsupervised-parsing work does); a sentence of fewer
    than three words has no span to compare.
    """
    stack: list[tuple[int, int]] = []
    spans: set[tuple[int, int]] = set()
    position = 0
    for transition in transitions:
        if transition == Transition.SHIFT:
            stack.append((position, position + 1))
            position += 1
        else:
            right = stack.pop()
            left = stack.pop()
            stack.append((left[0], right[1]))
            spans.add(stack[-1])
    spans.discard((0, position))
    return spans


def left_branching(n_tokens: int) -> list[int]:
    """((w1 w2) w3) ...: SHIFT SHIFT REDUCE, then SHIFT REDUCE per further word."""
    return [Transition.SHIFT] + [Transition.SHIFT, Transition.REDUCE] * (n_tokens - 1)


def right_branching(n_tokens: int) -> list[int]:
    """w1 (w2 (w3 ...)): every SHIFT first, then every REDUCE."""
    return [Transition.SHIFT] * n_tokens + [Transition.REDUCE] * (n_tokens - 1)


def bracket_counts(predicted: Sequence[int], gold: Sequence[int]) -> tuple[int, int, int]:
    """(matched, predicted, gold) non-trivial spans: sum over sentences, then F1 = 2m / (p + g)."""
    ours, theirs = constituent_spans(predicted), constituent_spans(gold)
    return len(ours & theirs), len(ours), len(theirs)
