"""A checkpoint torch refuses, or one whose weights do not fit its config, is said in one
line the user can act on (spinn.ground.errors.refused_checkpoint, misfit_weights), on real torch failures.

The model loaders call these where torch fails (spinn/model: after the split of that package lands).
"""

from __future__ import annotations

import collections
import pickle

import pytest
import torch

from spinn.ground.errors import misfit_weights, refused_checkpoint


def test_a_checkpoint_torch_refuses_is_never_answered_with_weights_only_false(tmp_path):
    path = tmp_path / "m.pt"
    path.write_bytes(pickle.dumps({"model_state": collections.OrderedDict}))  # a class: code, not data
    with pytest.raises(pickle.UnpicklingError) as refused:
        torch.load(path, weights_only=True)
    assert "weights_only=False" in str(refused.value) or "weights_only` set to `False`" in str(refused.value)
    message = str(refused_checkpoint(path, refused.value))
    assert message.startswith(f"{path}: not a spinn checkpoint, or one from an untrusted source")
    assert "False" not in message and "\n" not in message


def test_a_damaged_file_is_not_readable_with_torch_s_first_line(tmp_path):
    path = tmp_path / "m.pt"
    path.write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(Exception) as failed:
        torch.load(path, weights_only=True)
    message = str(refused_checkpoint(path, failed.value))
    assert message.startswith(f"{path}: not a readable spinn checkpoint (") and "\n" not in message


@pytest.mark.parametrize(
    ("saved_hidden", "drop", "expected"),
    [
        (8, None, "1.weight is (8, 8) in the checkpoint, (4, 4) in the model its config builds"),
        (4, "1.bias", "the checkpoint has no 1.bias"),
    ],
)
def test_weights_that_do_not_fit_name_the_first_tensor_and_both_shapes(saved_hidden, drop, expected):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(4, 4))
    saved = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(saved_hidden, saved_hidden)).state_dict()
    if drop:
        del saved[drop]
    with pytest.raises(RuntimeError):  # what torch says: a page naming every tensor
        model.load_state_dict(saved)
    message = str(misfit_weights("m.pt", model.state_dict(), saved))
    assert message == f"m.pt: weights do not fit the model config: {expected}"
