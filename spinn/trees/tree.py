"""Constituency trees: one immutable type for n-ary PTB trees and binary trees.

SNLI ships two bracketings per sentence. `sentence*_parse` is a labelled n-ary
Penn Treebank tree, `(ROOT (S (NP (DT A) (NN dog)) ...))`; `sentence*_binary_parse`
is an unlabelled binary tree with space-separated brackets, `( ( A dog ) ... )`.
Both become `Tree`s (the binary format through spinn.trees.transitions, whose post-order
it is); a leaf is a node without children whose label is the word.
Errors are `TreeError`s carrying a machine-readable reason, because `prepare`
files a bad parse under that reason in its rejects file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from spinn.ground.errors import SpinnError

OPEN = "("
CLOSE = ")"
_PTB_TOKEN = re.compile(r"\(|\)|[^\s()]+")


class TreeProblem(str, Enum):
    """Why a bracketing could not be read; the values are reject reasons."""

    EMPTY = "empty_parse"
    UNBALANCED = "unbalanced_parse"
    MALFORMED = "malformed_parse"


class TreeError(SpinnError):
    """A bracketing that is not a tree; `problem` says which way it is broken."""

    def __init__(self, problem: TreeProblem, message: str):
        super().__init__(message)
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Tree:
    """A constituent: a label and children, or a word when it has no children.

    Binary trees from `sentence*_binary_parse` have empty labels on inner nodes.
    """

    label: str
    children: tuple[Tree, ...] = ()

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and self.children[0].is_leaf

    def leaves(self) -> list[str]:
        """The words, left to right (iterative: parses can be deep)."""
        words: list[str] = []
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            if node.is_leaf:
                words.append(node.label)
            else:
                stack.extend(reversed(node.children))
        return words

    def is_binary(self) -> bool:
        """True when every inner node has exactly two children."""
        return self.is_leaf or (len(self.children) == 2 and all(child.is_binary() for child in self.children))


def leaf(word: str) -> Tree:
    return Tree(word)


def node(left: Tree, right: Tree) -> Tree:
    """An unlabelled binary node, as in SNLI's binary parses."""
    return Tree("", (left, right))


def parse_ptb(text: str) -> Tree:
    """Read a labelled n-ary tree such as `(ROOT (S (NP (DT A) (NN dog))))`.

    Every `(` must be followed by a label; a leaf is a bare word inside its
    preterminal. Raises TreeError naming what is wrong.
    """
    tokens = _PTB_TOKEN.findall(text)
    if not tokens:
        raise TreeError(TreeProblem.EMPTY, "empty parse")
    if tokens.count(OPEN) != tokens.count(CLOSE):
        raise TreeError(
            TreeProblem.UNBALANCED,
            f"unbalanced parse: {tokens.count(OPEN)} '(' but {tokens.count(CLOSE)} ')'",
        )
    if tokens[0] != OPEN:
        raise TreeError(TreeProblem.MALFORMED, f"parse must start with '(', not {tokens[0]!r}")
    root, end = _read_ptb(tokens, 0)
    if end != len(tokens):
        raise TreeError(TreeProblem.MALFORMED, "text after the end of the tree")
    return root


def _read_ptb(tokens: list[str], start: int) -> tuple[Tree, int]:
    """Read the constituent opening at tokens[start]; return it and the next index."""
    stack: list[tuple[str, list[Tree]]] = []
    position = start
    while position < len(tokens):
        token = tokens[position]
        if token == OPEN:
            label = tokens[position + 1] if position + 1 < len(tokens) else CLOSE
            if label == CLOSE:
                raise TreeError(TreeProblem.EMPTY, "empty brackets '( )'")
            if label == OPEN:  # an unlabelled root, as in `( (S ...))`
                stack.append(("", []))
                position += 1
                continue
            stack.append((label, []))
            position += 2
            continue
        if token == CLOSE:
            label, children = stack.pop()
            if not children:
                raise TreeError(TreeProblem.EMPTY, f"constituent {label!r} has no children")
            finished = Tree(label, tuple(children))
            position += 1
            if not stack:
                return finished, position
            stack[-1][1].append(finished)
            continue
        stack[-1][1].append(Tree(token))
        position += 1
    raise TreeError(TreeProblem.UNBALANCED, "parse ends before its brackets close")


def format_binary(tree: Tree) -> str:
    """Write a binary tree in SNLI's `( left right )` format; a lone word stays bare."""
    parts: list[str] = []
    stack: list[Tree | str] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
        elif item.is_leaf:
            parts.append(item.label)
        else:
            stack.append(CLOSE)
            stack.extend(reversed(item.children))
            parts.append(OPEN)
    return " ".join(parts)


def format_ptb(tree: Tree) -> str:
    """Write a labelled tree in PTB format, `(S (NP (DT A) (NN dog)) ...)`."""
    if tree.is_leaf:
        return tree.label
    inside = " ".join(format_ptb(child) for child in tree.children)
    return f"({tree.label} {inside})"
