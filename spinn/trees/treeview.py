"""A self-contained HTML page of binary trees drawn as SVG: a quick look at what a model parses.

No JavaScript and no external assets, so the page opens anywhere, including
as an MLflow artifact; words are escaped, so any input text is safe to show.
"""

from __future__ import annotations

import html
from pathlib import Path

from spinn.io import atomic_path
from spinn.trees.tree import Tree

LEAF_GAP = 64  # px between neighbouring words
LEVEL_GAP = 36  # px between tree levels
MARGIN = 20
PAGE = (
    "<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
    "<style>body{{font-family:sans-serif}} svg text{{font-size:13px}}</style></head>"
    "<body><h1>{title}</h1>{body}</body></html>\n"
)


def render_trees(trees: list[Tree], path: Path, title: str = "Induced trees") -> Path:
    """Write one SVG figure per tree into an HTML page at `path`."""
    figures = "".join(f"<figure>{tree_svg(tree)}<figcaption>{_caption(tree)}</figcaption></figure>" for tree in trees)
    with atomic_path(Path(path)) as temporary:
        temporary.write_text(PAGE.format(title=html.escape(title), body=figures), encoding="utf-8")
    return Path(path)


def tree_svg(tree: Tree) -> str:
    """Leaves evenly spaced on the bottom line, each inner node above the middle of its children."""
    positions: dict[int, tuple[float, int]] = {}
    height = _place(tree, positions, [0])
    lines, labels = [], []
    for node, (x, level) in _walk(tree, positions):
        y = MARGIN + (height - level) * LEVEL_GAP
        for child in node.children:
            child_x, child_level = positions[id(child)]
            child_y = MARGIN + (height - child_level) * LEVEL_GAP
            lines.append(f"<line x1='{x}' y1='{y}' x2='{child_x}' y2='{child_y}' stroke='#555'/>")
        if node.is_leaf:
            labels.append(f"<text x='{x}' y='{y + 14}' text-anchor='middle'>{html.escape(node.label)}</text>")
    width = MARGIN * 2 + LEAF_GAP * max(len(tree.leaves()) - 1, 0)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' "
        f"height='{MARGIN * 2 + height * LEVEL_GAP + 20}'>{''.join(lines)}{''.join(labels)}</svg>"
    )


def _place(node: Tree, positions: dict[int, tuple[float, int]], next_leaf: list[int]) -> int:
    """Assign (x, level) to every node, leaves at level 0; returns the node's level."""
    if node.is_leaf:
        positions[id(node)] = (MARGIN + LEAF_GAP * next_leaf[0], 0)
        next_leaf[0] += 1
        return 0
    levels = [_place(child, positions, next_leaf) for child in node.children]
    x = sum(positions[id(child)][0] for child in node.children) / len(node.children)
    positions[id(node)] = (x, max(levels) + 1)
    return max(levels) + 1


def _walk(tree: Tree, positions: dict[int, tuple[float, int]]):
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node, positions[id(node)]
        stack.extend(node.children)


def _caption(tree: Tree) -> str:
    return html.escape(" ".join(tree.leaves()))
