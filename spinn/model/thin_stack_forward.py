"""The thin stack: every node vector of a batch in one memory, and the fused encoder's forward loop over it.

Bowman et al. (2016) keep the stacks of a batch as one array of node vectors
written once per node, plus back-pointers; the backward pass walks the steps in
reverse, moving gradients along the same pointers. Here the whole encoding is
one autograd Function with both loops written out (the backward one in
spinn/model/thin_stack_backward.py), so that each transition step is a handful
of large kernels and nothing reads a value back to the host. The readable
encoder it must equal, step for step, is spinn/model/spec.py.

The loops own the addressing and the cells (spinn/model/cells.py) the
arithmetic. The memory is two planes, h and c, with a row per node in each:
(2, R, D). Forward, per step: one gather of the rows every sentence reads
(buffer top, stack second, stack top) from both planes into (2, 3N, D); the
tracker's GEMMs over the gathered h plane, (N, 3D) as it lies, and its own h,
then its step; the composition's GEMMs over the children's h, the same plane's
last (N, 2D) columns, and the tracker's h, then its step over the children's c
(the c plane), written straight into the step's node rows of both planes. Each
GEMM multiplies exactly the h it reads: no zero weight columns for c. Every
sentence computes every step, so all shapes are fixed by (N, L, T) and the
step can be captured in a CUDA graph; a node that was not a REDUCE is never
read, and gets no gradient.

The compact variant of the same loops (CPU training on gold transitions) spends
nothing on those: the plan's compact addresses give a node row only to each
REDUCE, M in all, so a step composes only its k REDUCEs, gathering their
children's rows (2, 2k, D) apart from the tracker's h reads (3N, D), and the
composition's tape and weight gradients run over M rows instead of T x N
(about a third on SNLI). Shapes then vary by step, which a CPU does not mind.

Addresses come from the run's StepPlan (gold transitions, worked out on the
host) or, when the model chooses its own transitions, from DeviceStacks, one
step at a time on the device (spinn/model/addressing.py).

Shapes: N sentences, L words, T steps, R memory rows, D hidden, Dt tracker,
K = 3 read slots, M composed nodes (T x N; compact, the REDUCEs), k a step's; the
memory is (2, R, D): [h plane; c plane].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from spinn.ground.errors import SpinnError
from spinn.model.addressing import (
    C_PLANE,
    CHILD_READS,
    H_PLANE,
    PLANES,
    READ_SLOTS,
    SLOT_NAMES,
    WORD_BASE,
    ZERO_ROW,
    ChildRows,
    CompactNodes,
    DeviceStacks,
    child_counts,
)
from spinn.model.cells import Reduce, Tracker, per_step
from spinn.model.encoder_run import EncoderOutput, Run
from spinn.model.thin_stack_backward import backward


def encode(words: Tensor, cells: tuple[Reduce, Tracker | None], run: Run, compact: bool = False) -> EncoderOutput:
    """words (N*L, 2D) = [h | c] of every word slot. compact: a node row only for each REDUCE, composing only
    those (gold transitions on a CPU; shapes then vary by step, so no CUDA graph can replay it)."""
    reduce, tracker = cells
    tracker_weights = (tracker.linear.weight, tracker.linear.bias) if tracker is not None else (None, None)
    roots, states, *chosen = _Encode.apply(
        words, reduce.linear.weight, reduce.linear.bias, *tracker_weights, cells, run, compact
    )
    if run.gold is not None:
        transitions, legal = run.gold.transitions, run.gold.plan.legal
    else:
        taken, legal = chosen
        transitions = taken.t()  # (N, T)
    return EncoderOutput(roots, states if tracker is not None else None, transitions, legal, run.real)


class _Encode(torch.autograd.Function):
    """Autocast stays outside: the cells run in the parameters' dtype (fp32), so bf16 never reaches a cell state."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, words, reduce_weight, reduce_bias, tracker_weight, tracker_bias, cells, run: Run, compact):
        nodes = _compact(run, words) if compact else None
        loop = _Loop(words, cells, run, keep=any(ctx.needs_input_grad[:5]), compact=nodes)
        outputs = loop.forward()  # roots, states, and with a chooser the actions taken and legal
        ctx.loop = loop
        ctx.set_materialize_grads(False)  # states no loss reads (pi) bring None, not a zero tensor to add
        if cells[1] is None:
            ctx.mark_non_differentiable(outputs[1])
        return outputs

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_roots, grad_states, *_chosen):
        return (*backward(ctx.loop, grad_roots, grad_states), None, None, None)


def _compact(run: Run, words: Tensor) -> CompactNodes:
    """The plan's compact addresses: a CPU plan of gold transitions has them (spinn/model/addressing.py)."""
    compact = run.gold.plan.compact if run.gold is not None else None
    if compact is None or words.device.type != "cpu":
        raise SpinnError(
            f"the fused_compact loop runs gold transitions on a CPU, not {'gold' if run.gold else 'chosen'}"
            f" transitions on {words.device.type}"
        )
    return compact


@dataclass(frozen=True)
class Weights:
    """The cells' weight blocks for the inputs as the loop gathers them, cut once per encoding."""

    tracker_reads: Tensor | None  # (4Dt, 3D) over the [buffer, second, top] h
    tracker_recurrent: Tensor | None  # (4Dt, Dt)
    reduce_children: Tensor  # (5D, 2D) over the [second, top] h
    reduce_tracking: Tensor | None  # (5D, Dt)

    @classmethod
    def of(cls, reduce: Reduce, tracker: Tracker | None) -> Weights:
        children = reduce.weight(*Reduce.CHILDREN)
        tracking = reduce.weight(Reduce.TRACKING) if reduce.d_tracker else None
        if tracker is None:
            return cls(None, None, children, tracking)
        return cls(tracker.weight(*SLOT_NAMES), tracker.weight(Tracker.RECURRENT), children, tracking)

    def transposed(self) -> Weights:
        blocks = (self.tracker_reads, self.tracker_recurrent, self.reduce_children, self.reduce_tracking)
        return Weights(*(None if weight is None else weight.t() for weight in blocks))


class _Loop:
    """The forward and backward loops of one encoding, with the buffers they share (the tape)."""

    def __init__(
        self, words: Tensor, cells: tuple[Reduce, Tracker | None], run: Run, keep: bool, compact: CompactNodes | None
    ):
        self.reduce, self.tracker = cells
        self.run, self.keep, self.compact = run, keep, compact
        layout = run.layout
        self.n, self.t_steps = layout.sentences, layout.steps
        self.d = words.shape[1] // 2
        self.dt = self.tracker.width if self.tracker is not None else 0
        self.weights = Weights.of(self.reduce, self.tracker)
        rows = compact.rows if compact is not None else layout.rows
        self.memory = words.new_empty(PLANES, rows, self.d)  # (2, R, D)
        self.memory[:, ZERO_ROW].zero_()
        self.memory[:, WORD_BASE : layout.node_base].copy_(words.view(-1, PLANES, self.d).transpose(0, 1))
        self.roots: Tensor | None = None  # (N,) each sentence's root row, once the forward loop ran
        self._make_tracker_tape(words)
        if compact is None:
            self._make_tape(words)
        else:
            self._make_compact_tape(words, compact)

    # ------------------------------------------------------------------ buffers

    def _make_tracker_tape(self, like: Tensor) -> None:
        n, steps = self.n, self.t_steps
        if self.tracker is None:
            return
        depth = steps if self.keep else 1
        self.states = like.new_zeros(steps + 1, n, self.dt)  # (T+1, N, Dt): h before step 0, then after each
        self.cells = like.new_zeros(depth + 1 if self.keep else 1, n, self.dt)  # c likewise (one deep at inference)
        self.h = self.states.unbind(0)
        self.c = self.cells.unbind(0) if self.keep else [self.cells[0]] * (steps + 1)
        self.tracker_tape = self.tracker.tape(like, [n] * depth, self.h[1:], self.c[1:])

    def _make_tape(self, like: Tensor) -> None:
        """Every sentence composes at every step, into its own node row: the shapes of a CUDA graph."""
        n, d, steps = self.n, self.d, self.t_steps
        depth = steps if self.keep else 1
        self.gathered = like.new_empty(PLANES, depth, READ_SLOTS * n, d)  # (2, T', 3N, D) the rows read
        self.gathered_rows = per_step(self.gathered.transpose(0, 1), steps)  # (2, 3N, D) each
        self.reads_h = self.gathered[H_PLANE].view(depth, n, READ_SLOTS * d)  # (T', N, 3D) [buffer | second | top]
        self.tracker_in = per_step(self.reads_h, steps)  # (N, 3D) each
        second = CHILD_READS[0] * d
        children_h = self.reads_h[:, :, second : second + len(CHILD_READS) * d]  # (T', N, 2D)
        self.children_h = per_step(children_h, steps)  # (N, 2D) each
        slots_c = self.gathered[C_PLANE].view(depth, n, READ_SLOTS, d)  # (T', N, 3, D)
        children_c = slots_c[:, :, CHILD_READS[0] : CHILD_READS[-1] + 1]  # (T', N, 2, D) [left, right]
        by_child = [per_step(child, steps) for child in children_c.unbind(2)]
        self.children_c_steps = list(zip(*by_child, strict=True))  # per step: ((N, D), (N, D))
        self.children_h_rows = children_h.view(-1, len(CHILD_READS) * d)  # (M, 2D), M = T'N: views, never copies
        self.children_c_rows = children_c.view(-1, len(CHILD_READS), d)  # (M, 2, D)
        self.tracking = self.h[1:] if self.tracker is not None else None  # (N, Dt) each
        nodes = self.memory[:, self.run.layout.node_base :].view(PLANES, steps, n, d)  # (2, T, N, D)
        self.reduce_tape = self.reduce.tape(like, [n] * depth, nodes[H_PLANE].unbind(0), nodes[C_PLANE].unbind(0))

    def _make_compact_tape(self, like: Tensor, compact: CompactNodes) -> None:
        """Only the REDUCEs compose, M in all, each into its own row, step after step; the tracker reads every
        sentence's h rows (no c), the composition its nodes' children (both planes)."""
        n, d, steps, counts = self.n, self.d, self.t_steps, compact.counts
        nodes = compact.reducers.shape[0]  # M
        if self.tracker is not None:
            depth = steps if self.keep else 1
            self.reads_h = like.new_empty(depth, READ_SLOTS * n, d)  # (T', 3N, D) the h rows the tracker reads
            self.gathered_h = per_step(self.reads_h, steps)
            self.tracker_in = per_step(self.reads_h.view(depth, n, READ_SLOTS * d), steps)  # (N, 3D) each
        children = ChildRows.of(like, counts, d)
        self.gathered_children = children.both
        self.children_h_rows, self.children_c_rows, self.children_h = children.h_rows, children.c_rows, children.h
        by_child = [child.split(counts) for child in self.children_c_rows.unbind(1)]
        self.children_c_steps = list(zip(*by_child, strict=True))  # per step: ((k, D), (k, D))
        self.child_reads = compact.children.view(-1).split(child_counts(counts))  # (2k,) each: [left, right] rows
        self.reducers = compact.reducers.split(counts)  # (k,) each
        self.tracking_rows = like.new_empty(nodes, self.dt) if self.tracker is not None else None  # (M, Dt)
        self.tracking = self.tracking_rows.split(counts) if self.tracker is not None else None  # (k, Dt) each
        planes = self.memory[:, self.run.layout.node_base :]  # (2, M, D)
        self.reduce_tape = self.reduce.tape(like, counts, planes[H_PLANE].split(counts), planes[C_PLANE].split(counts))

    # ------------------------------------------------------------------ forward

    def forward(self) -> tuple[Tensor, ...]:
        """Roots (N, D), tracker states (T, N, Dt) (empty without a tracker), and with a chooser the actions
        taken (T, N) and the legal ones (T, N, 2)."""
        weights = self.weights.transposed()
        reads = self._read_plan()
        for step in range(self.t_steps):
            self._gather(step, reads(step))
            if self.tracker is not None:
                self._track(step, weights)
                self._choose(step)
            self._compose(step, weights)
        self.roots = self._roots()
        h_roots = self.memory[H_PLANE].index_select(0, self.roots)  # (N, D)
        states = self.states[1:].clone() if self.tracker is not None else h_roots.new_empty(0)  # (T, N, Dt)
        if self.run.chooser is None:
            return h_roots, states
        return h_roots, states, self.taken, self.legal

    def _roots(self) -> Tensor:
        if self.compact is not None:
            return self.compact.roots
        return self.run.gold.plan.roots if self.run.gold is not None else self.stacks.roots()

    def _read_plan(self) -> Callable[[int], Tensor]:
        """Step -> the (3N,) rows to gather: from the plan, or from the device stacks as the model chooses."""
        if self.run.gold is not None:
            self.reads = self.compact.reads if self.compact is not None else self.run.gold.plan.reads
            per_step_reads = self.reads.view(self.t_steps, READ_SLOTS * self.n).unbind(0)
            return per_step_reads.__getitem__
        device = self.memory.device
        self.stacks = DeviceStacks(self.run.lengths, self.run.layout)
        self.reads = torch.empty(self.t_steps, self.n, READ_SLOTS, dtype=torch.long, device=device)
        self.taken = torch.empty(self.t_steps, self.n, dtype=torch.long, device=device)
        self.legal = torch.empty(self.t_steps, self.n, 2, dtype=torch.bool, device=device)
        self.reads[0] = self.stacks.reads()
        per_step_reads = self.reads.view(self.t_steps, READ_SLOTS * self.n).unbind(0)
        return per_step_reads.__getitem__

    def _gather(self, step: int, reads: Tensor) -> None:
        """The rows the step reads: all three slots of both planes; compact, the tracker's h rows and the
        composing nodes' children (both planes)."""
        if self.compact is None:
            torch.index_select(self.memory, 1, reads, out=self.gathered_rows[step])
            return
        if self.tracker is not None:
            torch.index_select(self.memory[H_PLANE], 0, reads, out=self.gathered_h[step])
        if self.compact.counts[step]:
            torch.index_select(self.memory, 1, self.child_reads[step], out=self.gathered_children[step])

    def _track(self, step: int, weights: Weights) -> None:
        """The tracker over the gathered rows and its own h: its two GEMMs into the tape, then its step."""
        tape = self.tracker_tape
        gates = torch.addmm(self.tracker.bias, self.tracker_in[step], weights.tracker_reads, out=tape.gates[step])
        gates.addmm_(self.h[step], weights.tracker_recurrent)
        self.tracker.step(gates, (self.c[step],), tape.out[step])

    def _compose(self, step: int, weights: Weights) -> None:
        """The composition over the two children (and the tracker's h), written into the step's node rows."""
        if self.compact is not None and not self.compact.counts[step]:
            return  # no REDUCE at this step: nothing to compose
        tape = self.reduce_tape
        gates = torch.addmm(self.reduce.bias, self.children_h[step], weights.reduce_children, out=tape.gates[step])
        if weights.reduce_tracking is not None:
            gates.addmm_(self._tracking(step), weights.reduce_tracking)
        self.reduce.step(gates, self.children_c_steps[step], tape.out[step])

    def _tracking(self, step: int) -> Tensor:
        """The tracker's h for the step's composition: every sentence's, or (compact) the composing ones'."""
        if self.compact is None:
            return self.tracking[step]
        return torch.index_select(self.h[step + 1], 0, self.reducers[step], out=self.tracking[step])

    def _choose(self, step: int) -> None:
        """With the model's own transitions: pick this step's actions, and work out the next step's reads."""
        chooser = self.run.chooser
        if chooser is None:
            return
        legal = self.stacks.legal()  # (N, 2)
        action = self.run.padded(chooser.choose(self.h[step + 1], legal, step), step)  # (N,)
        self.taken[step], self.legal[step] = action, legal
        self.stacks.apply(action, self.reads[step], step)
        if step + 1 < self.t_steps:
            self.reads[step + 1] = self.stacks.reads()
