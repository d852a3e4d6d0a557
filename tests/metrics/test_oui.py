"""The batch-based OUI against its definition counted by hand, on linear and conv outputs."""

import pytest
import torch

from sam_runner.errors import UserError
from sam_runner.metrics import oui


def _by_hand(a):
    b = a.shape[0]
    flat = a.reshape(b, -1)
    scores = []
    for j in range(flat.shape[1]):
        s = sum(1 for i in range(b) if flat[i, j].item() > 0)
        scores.append(min(s, b - s) / (b // 2))
    return sum(scores) / len(scores)


def test_units_always_on_or_off_score_0_and_half_split_units_1():
    on_off = torch.tensor([[1.0, -1.0, 0.0]] * 6)  # 0 is not positive
    assert oui(on_off) == 0.0
    halves = torch.tensor([[1.0, -2.0]] * 3 + [[-1.0, 3.0]] * 3)
    assert oui(halves) == 1.0
    assert oui(torch.tensor([[1.0], [1.0], [-1.0], [2.0]])) == pytest.approx(0.5)  # s=3 of B=4


@pytest.mark.parametrize("shape", [(8, 5), (7, 5), (9, 3, 4, 4), (6, 2, 10)])
def test_equals_the_definition_counted_unit_by_unit(shape):
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    assert oui(a) == pytest.approx(_by_hand(a), rel=1e-12)


def test_a_conv_unit_is_a_channel_at_a_position():
    # channel 0 splits the batch at one position only; channel-level pooling would score it 0
    a = -torch.ones(4, 2, 1, 2)
    a[:2, 0, 0, 0] = 1.0
    assert oui(a) == pytest.approx(1 / 4)


def test_a_batch_of_one_is_refused():
    with pytest.raises(UserError, match="a batch of at least 2"):
        oui(torch.ones(1, 3))
