"""The HTML tree drawings: one SVG per tree, an edge per parent-child link, every word shown and escaped."""

from __future__ import annotations

from spinn.trees.transitions import parse_binary
from spinn.trees.treeview import render_trees, tree_svg


def test_each_tree_is_one_svg_with_an_edge_per_link_and_its_words(tmp_path):
    trees = [parse_binary("( ( A man ) ( ( is sleeping ) . ) )"), parse_binary("( <b>&amp; ( x y ) )")]
    page = render_trees(trees, tmp_path / "trees.html").read_text(encoding="utf-8")
    assert page.count("<svg") == 2
    first = tree_svg(trees[0])
    assert first.count("<line") == 2 * (len(trees[0].leaves()) - 1)
    assert [word in first for word in ("A", "man", "is", "sleeping", ".")] == [True] * 5
    assert "<b>" not in page and "&lt;b&gt;&amp;amp;" in page
