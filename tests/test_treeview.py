"""The HTML tree drawings: one SVG per tree, an edge per parent-child link, every word shown and escaped."""

from __future__ import annotations

import re
from fractions import Fraction
from itertools import combinations

import pytest

from spinn.trees.transitions import parse_binary
from spinn.trees.tree import leaf, node
from spinn.trees.treeview import render_trees, tree_svg


def test_each_tree_is_one_svg_with_an_edge_per_link_and_its_words(tmp_path):
    trees = [parse_binary("( ( A man ) ( ( is sleeping ) . ) )"), parse_binary("( <b>&amp; ( x y ) )")]
    page = render_trees(trees, tmp_path / "trees.html").read_text(encoding="utf-8")
    assert page.count("<svg") == 2
    first = tree_svg(trees[0])
    assert first.count("<line") == 2 * (len(trees[0].leaves()) - 1)
    assert [word in first for word in ("A", "man", "is", "sleeping", ".")] == [True] * 5
    assert "<b>" not in page and "&lt;b&gt;&amp;amp;" in page


# ----------------------------------------------------------------------------- a drawing whose edges never cross

Point = tuple[Fraction, Fraction]
Segment = tuple[Point, Point]
_LINE = re.compile(r"<line x1='([^']+)' y1='([^']+)' x2='([^']+)' y2='([^']+)'")
_TEXT = re.compile(r"<text x='([^']+)' y='([^']+)'[^>]*>([^<]*)</text>")
DEEP_WORDS = 120
"""Deeper than a recursive walk would like, and wider than any sentence the model reads."""
DRAWN = {
    "left-branching": "( ( ( ( A man ) is ) sleeping ) . )",
    "right-branching": "( A ( man ( is ( sleeping . ) ) ) )",
    "balanced": "( ( ( A tall ) ( man is ) ) ( ( sleeping on ) ( the bench ) ) )",
    # the shape that crossed in the first layout: the edge from the root down to "A" cut through its sibling
    "long-edge-over-a-subtree": "( A ( ( ( man ( who ( is ( very ( tall today ) ) ) ) ) walked ) ( the dog ) ) )",
    "deep": "( " * (DEEP_WORDS - 1) + "w0 " + " ".join(f"w{i} )" for i in range(1, DEEP_WORDS)),
}


def segments(svg: str) -> list[Segment]:
    return [((Fraction(x1), Fraction(y1)), (Fraction(x2), Fraction(y2))) for x1, y1, x2, y2 in _LINE.findall(svg)]


def _turn(a: Point, b: Point, c: Point) -> int:
    """-1, 0 or 1: which side of the line a -> b the point c is on (0: on the line)."""
    cross = (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
    return (cross > 0) - (cross < 0)


def _lies_on(point: Point, segment: Segment) -> bool:
    (a, b), (x, y) = segment, point
    return (
        _turn(a, b, point) == 0 and min(a[0], b[0]) <= x <= max(a[0], b[0]) and min(a[1], b[1]) <= y <= max(a[1], b[1])
    )


def meet(first: Segment, second: Segment) -> bool:
    """Whether two edges share any point but a common end: they cross, touch, overlap, or are one edge twice."""
    if set(first) == set(second):
        return True
    (p1, p2), (q1, q2) = first, second
    if _turn(q1, q2, p1) * _turn(q1, q2, p2) < 0 and _turn(p1, p2, q1) * _turn(p1, p2, q2) < 0:
        return True
    shared = set(first) & set(second)
    ends = [(end, second) for end in first if end not in shared] + [(end, first) for end in second if end not in shared]
    return any(_lies_on(end, other) for end, other in ends)


@pytest.mark.parametrize("bracketing", DRAWN.values(), ids=DRAWN.keys())
def test_no_two_edges_of_a_drawn_tree_meet(bracketing):
    tree = parse_binary(bracketing)
    edges = segments(tree_svg(tree))
    assert len(edges) == 2 * (len(tree.leaves()) - 1)
    assert not [pair for pair in combinations(edges, 2) if meet(*pair)]


@pytest.mark.parametrize("bracketing", DRAWN.values(), ids=DRAWN.keys())
def test_the_words_read_in_sentence_order_on_one_line_under_every_node(bracketing):
    tree = parse_binary(bracketing)
    svg = tree_svg(tree)
    words = [(Fraction(x), Fraction(y), word) for x, y, word in _TEXT.findall(svg)]
    assert [word for _, _, word in sorted(words)] == [word for _, _, word in words] == tree.leaves()
    assert len({y for _, y, _ in words}) == 1
    children: dict[Point, list[Point]] = {}
    for upper, lower in (sorted(edge, key=lambda point: point[1]) for edge in segments(svg)):
        children.setdefault(upper, []).append(lower)
    assert all(len(below) == 2 for below in children.values())
    assert all(min(x for x, _ in below) < x < max(x for x, _ in below) for (x, _), below in children.items())


def test_a_subtree_that_occurs_twice_is_drawn_twice():
    """Nodes are placed by the words they span, not by object identity, so a shared subtree object is not
    drawn once at its last place."""
    twice = node(node(leaf("a"), leaf("b")), node(leaf("c"), leaf("d")))
    shared = node(leaf("x"), leaf("y"))
    assert segments(tree_svg(node(shared, shared))) == segments(tree_svg(twice))
