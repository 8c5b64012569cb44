"""The inference step: a device batch in, the model's output out, without gradients, from a CUDA graph on a GPU.

`predict` runs it over a corpus (`encode` each distinct sentence, then
`classify` the pairs), `spinn bench --mode infer` times the whole model on
pair batches, and training keeps one for its periodic dev evaluation so
that the graphs it captured survive from one evaluation to the next.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spinn.ground.errors import SpinnError
from spinn.inference.graphs import Graphs
from spinn.model.batch import Batch
from spinn.model.config import EncoderLoop, SPINNConfig, TransitionSource
from spinn.model.precision import autocast, check_int8
from spinn.model.spinn import SPINN, Encoding, SPINNOutput


class InferStep:
    """Call with a device batch: the model's output without gradients, eager or replayed from a CUDA graph.

    What it returns is the caller's to keep (a replayed graph's outputs are copied out)."""

    def __init__(
        self, model: SPINN, source: TransitionSource, *, amp: bool = False, graphs: bool = True, int8: bool = False
    ):
        """source: gold (the batch's parses) or greedy (the tracker's best legal action, spinn and rl);
        sampling is for rl's training step, never for inference. int8: quantize the model's linear layers
        (in place; CPU only)."""
        if source is TransitionSource.SAMPLED:
            raise SpinnError("inference runs on gold or greedy transitions; sampled ones are for training rl")
        self.model, self.source, self.amp = model, source, amp
        self.device = next(model.parameters()).device
        self.loop = inference_loop(model.config, self.device, amp)
        if int8:
            check_int8(self.device)
            model.quantize_int8()
        graphed = graphs and self.device.type == "cuda"
        self.graphs = Graphs(self._run, self.device) if graphed else None
        self.encoder_graphs = Graphs(self._encode, self.device) if graphed else None

    def __call__(self, batch: Batch) -> SPINNOutput:
        """The whole model over a batch of pairs."""
        self.model.eval()
        if self.graphs is None:
            return self._run(batch)
        return SPINNOutput(*_copied(self.graphs.run(batch)))

    def encode(self, sentences: Batch) -> Encoding:
        """The encoder over a batch of sentences (sentence_batch): vectors, transition scores, transitions."""
        self.model.eval()
        if self.encoder_graphs is None:
            return self._encode(sentences)
        return Encoding(*_copied(self.encoder_graphs.run(sentences)))

    def classify(self, premise: Tensor, hypothesis: Tensor) -> Tensor:
        """(B, C) class logits of B pairs from their sentence vectors (B, D) each; a small eager step."""
        self.model.eval()
        with torch.no_grad(), autocast(self.device, self.amp, False):
            return self.model.classifier(premise, hypothesis)

    def _run(self, batch: Batch) -> SPINNOutput:
        with torch.no_grad(), autocast(self.device, self.amp, self.graphs is not None):
            return self.model(batch, source=self.source, loop=self.loop)

    def _encode(self, sentences: Batch) -> Encoding:
        with torch.no_grad(), autocast(self.device, self.amp, self.encoder_graphs is not None):
            return self.model.encode(
                sentences.tokens, sentences.lengths, self.source, sentences.plan, sentences.transitions, loop=self.loop
            )


def inference_loop(config: SPINNConfig, device: torch.device, amp: bool) -> EncoderLoop:
    """The encoder loop inference runs: a spec model its spec; on a CPU without autocast the loop that computes
    only the rows read (no CUDA graph there needs fixed shapes, and it has no bf16 path); else the fused one."""
    if config.loop is EncoderLoop.SPEC:
        return EncoderLoop.SPEC
    if device.type == "cpu" and not amp:
        return EncoderLoop.CPU_INFERENCE
    return EncoderLoop.FUSED


def _copied(outputs: tuple) -> list:
    """A replayed graph's outputs, copied out: the next replay of that shape overwrites them."""
    return [None if value is None else value.clone() for value in outputs]
