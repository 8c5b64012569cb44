"""A self-contained HTML page of binary trees drawn as SVG: a quick look at what a model parses.

No JavaScript and no external assets, so the page opens anywhere, including
as an MLflow artifact; words are escaped, so any input text is safe to show.

The layout is the one that cannot cross: the words sit on one line in sentence
order, and every node is drawn at the apex of the triangle over the words it
spans (x the middle of its first and last word, height growing with how many
words it spans). A child's apex then lies on a side of its parent's triangle,
so each edge runs along its parent's side, and sibling triangles share no
point: no two edges cross, whatever the tree's shape. Placing a node by its
height above the words instead (the first layout) let a long edge down to a
word cut through its sibling's subtree.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import NamedTuple

from spinn.ground.io import atomic_path
from spinn.trees.tree import Tree

LEAF_GAP = 64  # px between neighbouring words
SPAN_RISE = 20  # px a node stands above the words per word it spans beyond its first
MARGIN = 20
LABEL_DROP = 14  # px from a word's point down to its text's baseline
LABEL_SPACE = 20  # px under the word line for the words' text
PAGE = (
    "<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
    "<style>body{{font-family:sans-serif}} svg text{{font-size:13px}}</style></head>"
    "<body><h1>{title}</h1>{body}</body></html>\n"
)


class Span(NamedTuple):
    """The words a node covers: indices of its first and last word."""

    first: int
    last: int


def render_trees(trees: list[Tree], path: Path, title: str = "Induced trees") -> Path:
    """Write one SVG figure per tree into an HTML page at `path`."""
    figures = "".join(f"<figure>{tree_svg(tree)}<figcaption>{_caption(tree)}</figcaption></figure>" for tree in trees)
    with atomic_path(Path(path)) as temporary:
        temporary.write_text(PAGE.format(title=html.escape(title), body=figures), encoding="utf-8")
    return Path(path)


def tree_svg(tree: Tree) -> str:
    """The words on one line in sentence order, every node at the apex over its span: no crossing edges."""
    words, edges = _spans(tree)
    word_line = MARGIN + SPAN_RISE * (len(words) - 1)  # room above it for the root, which spans every word
    lines = []
    for parent, child in edges:
        (x1, y1), (x2, y2) = _point(parent, word_line), _point(child, word_line)
        lines.append(f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='#555'/>")
    labels = []
    for index, word in enumerate(words):
        x, y = _point(Span(index, index), word_line)
        labels.append(f"<text x='{x}' y='{y + LABEL_DROP}' text-anchor='middle'>{html.escape(word)}</text>")
    width = MARGIN * 2 + LEAF_GAP * max(len(words) - 1, 0)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' "
        f"height='{word_line + LABEL_SPACE + MARGIN}'>{''.join(lines)}{''.join(labels)}</svg>"
    )


def _spans(tree: Tree) -> tuple[list[str], list[tuple[Span, Span]]]:
    """The words in order and every (parent span, child span) edge, in one iterative post-order walk
    (parses can be deep); spans, not node identities, place the nodes, so a subtree object that occurs
    twice is still drawn twice."""
    words: list[str] = []
    edges: list[tuple[Span, Span]] = []
    finished: list[Span] = []  # the spans of the children walked so far, innermost last
    work: list[tuple[Tree, bool]] = [(tree, False)]
    while work:
        node, children_done = work.pop()
        if node.is_leaf:
            finished.append(Span(len(words), len(words)))
            words.append(node.label)
        elif not children_done:
            work.append((node, True))
            work.extend((child, False) for child in reversed(node.children))
        else:
            children = finished[-len(node.children) :]
            del finished[-len(node.children) :]
            span = Span(children[0].first, children[-1].last)
            edges.extend((span, child) for child in children)
            finished.append(span)
    return words, edges


def _point(span: Span, word_line: int) -> tuple[float, int]:
    """A node's apex: over the middle of its span, higher by SPAN_RISE for each word past its first."""
    return MARGIN + LEAF_GAP * (span.first + span.last) / 2, word_line - SPAN_RISE * (span.last - span.first)


def _caption(tree: Tree) -> str:
    return html.escape(" ".join(tree.leaves()))
