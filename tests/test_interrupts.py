"""An interrupt (Ctrl-C, or the hang-up that stops an orphaned command) that arrives while a checkpoint is
written stops the command once the checkpoint is published, as the interrupt it is (spinn.ground.children's
deferred_interrupts); torch's writer, torn mid-record, would answer with its own RuntimeError instead."""

from __future__ import annotations

import signal

import pytest
import torch

from spinn.ground import children
from spinn.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from spinn.model.config import SPINNConfig
from tests.helpers import TINY, untrained_checkpoint

TEARING_WRITE = 3
"""The stream write during which the interrupt arrives: past torch's first record, inside its data."""


def raise_hangup(_number, _frame):
    raise children.Hangup


def tiny_checkpoint(step: int) -> Checkpoint:
    return untrained_checkpoint(SPINNConfig(variant="spinn", **TINY), step)


class InterruptedStream:
    """The checkpoint's file, with `number` raised in this process while torch writes into it."""

    def __init__(self, stream, number: int) -> None:
        self.stream, self.number, self.writes = stream, number, 0

    def write(self, data) -> int:
        self.writes += 1
        if self.writes == TEARING_WRITE:
            signal.raise_signal(self.number)
        return self.stream.write(data)

    def __getattr__(self, name):
        return getattr(self.stream, name)


@pytest.mark.parametrize(
    ("number", "handler", "interrupt"),
    [
        (signal.SIGINT, signal.default_int_handler, KeyboardInterrupt),
        (signal.SIGHUP, raise_hangup, children.Hangup),
    ],
    ids=["ctrl-c", "hang-up"],
)
def test_an_interrupt_while_a_checkpoint_is_written_stops_after_it_is_published(
    tmp_path, monkeypatch, number, handler, interrupt
):
    path = save_checkpoint(tmp_path / "last.pt", tiny_checkpoint(step=1))
    write = torch.save
    monkeypatch.setattr(torch, "save", lambda data, stream: write(data, InterruptedStream(stream, number)))
    previous = signal.signal(number, handler)
    try:
        with pytest.raises(interrupt):
            save_checkpoint(path, tiny_checkpoint(step=2))
        assert signal.getsignal(number) is handler  # put back as it was
    finally:
        signal.signal(number, previous)
    assert load_checkpoint(path).step == 2  # written whole and published, then stopped
    assert sorted(file.name for file in tmp_path.iterdir()) == ["last.pt"]  # no temporary left beside it


def test_without_the_hold_torch_answers_an_interrupt_with_its_own_error(tmp_path):
    """Why the hold is there: torch's writer, closed after an interrupt mid-record, raises in its place."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever an earlier test here left
    try:
        with pytest.raises(RuntimeError, match="unexpected pos") as torn, (tmp_path / "torn.pt").open("wb") as out:
            torch.save(tiny_checkpoint(step=1).to_dict(), InterruptedStream(out, signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(torn.value.__context__, KeyboardInterrupt)


def test_a_signal_that_acts_while_the_hold_is_set_up_leaves_every_handler_as_it_was(monkeypatch):
    """The hold sets its handler signal by signal; a handler that acts between two (here the hang-up's raises
    as its own handler would have) must not leave Ctrl-C held for the rest of the process."""
    real = signal.signal

    def setting(number, handler):
        if number == signal.SIGHUP and getattr(handler, "__name__", "") == "note":
            raise children.Hangup
        return real(number, handler)

    previous = real(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(children.signal, "signal", setting)
    try:
        with pytest.raises(children.Hangup), children.deferred_interrupts():
            pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        real(signal.SIGINT, previous)
