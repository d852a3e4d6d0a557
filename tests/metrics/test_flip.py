"""The flip probability: the sequences' frames, a per-sample loop for the ordered kinds, noise
against its first frame, and a model that never flips."""

import pytest
import torch
from torch import nn

from sam_runner.metrics.flip import KINDS, flip_probabilities, frame


def test_frames():
    x = torch.arange(6.0).view(1, 1, 6)
    g = torch.Generator().manual_seed(0)
    assert frame("translate", x, 2, g).flatten().tolist() == [0, 0, 0, 1, 2, 3]
    assert frame("brightness", x, 3, g).flatten().tolist() == pytest.approx(
        [v + 0.15 for v in range(6)]
    )
    assert torch.equal(frame("scale", x, 0, g), x) and torch.equal(frame("noise", x, 0, g), x)
    image = torch.rand(2, 3, 8, 8)
    zoomed = frame("scale", image, 5, g)  # ×1.1 about the centre, cropped back
    assert zoomed.shape == image.shape and not torch.equal(zoomed, image)
    assert frame("translate", image, 1, g)[0, 0, 1:, 1:].equal(image[0, 0, :-1, :-1])
    with pytest.raises(ValueError, match="flip kind 'blur' is unknown"):
        frame("blur", x, 1, g)


class Threshold(nn.Module):
    """Class 1 where the input's mean exceeds 0, else 0."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x):
        m = x.flatten(1).mean(1) * self.w
        return torch.stack([-m, m], 1)


def test_ordered_kinds_equal_a_per_sample_loop():
    torch.manual_seed(0)
    x = torch.randn(20, 1, 16) * 0.3
    model = Threshold()
    batches = [(x[:12], None), (x[12:], None)]
    out = flip_probabilities(model, batches, frames=6, kinds=("translate", "brightness", "scale"))
    g = torch.Generator()
    for kind in ("translate", "brightness", "scale"):
        per_sample = []
        for i in range(20):
            preds = [int(model(frame(kind, x[i : i + 1], t, g)).argmax()) for t in range(6)]
            per_sample.append(sum(a != b for a, b in zip(preds, preds[1:])) / 5)
        assert out[f"flip_prob_{kind}"] == pytest.approx(sum(per_sample) / 20)
    assert out["flip_prob"] == pytest.approx(
        sum(out[f"flip_prob_{k}"] for k in ("translate", "brightness", "scale")) / 3
    )


def test_noise_is_against_the_first_frame_and_seeded():
    # the first frame of a sample on the boundary is class 0 (a tie), each noisy frame class 1
    # with probability ½: the boundary half flips on ½ of its frames, the far half never
    x = torch.cat([torch.zeros(50, 1, 4), torch.full((50, 1, 4), 5.0)])
    model = Threshold()
    out = flip_probabilities(model, [(x, None)], frames=11, kinds=("noise",), seed=3)
    assert 0.2 < out["flip_prob_noise"] < 0.3  # ¼ overall; its standard deviation is 0.011
    far = flip_probabilities(model, [(x[50:], None)], frames=11, kinds=("noise",), seed=3)
    assert far["flip_prob_noise"] == 0.0
    again = flip_probabilities(model, [(x, None)], frames=11, kinds=("noise",), seed=3)
    assert again == out


def test_a_constant_model_never_flips():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.copy_(torch.tensor([0.0, 1.0, 0.0]))
    out = flip_probabilities(model, [(torch.randn(8, 1, 4, 4), None)], frames=4)
    assert out == {**{f"flip_prob_{k}": 0.0 for k in KINDS}, "flip_prob": 0.0}
