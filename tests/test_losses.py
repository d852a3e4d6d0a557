"""trainer.loss: cross-entropy and MSE on one-hot targets, used by training, the test loss and
the curvature measurements alike."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, compose

from sam_runner.errors import UserError
from sam_runner.losses import mean_loss, per_example
from sam_runner.train import train


def test_mse_is_half_the_squared_distance_to_the_one_hot_target_per_example():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    y = torch.tensor([0, 2])
    expected = torch.tensor([0.5 * (1.0 + 0.0 + 1.0), 0.5 * (0.25 + 0.25 + 0.25)])
    torch.testing.assert_close(per_example("mse")(logits, y), expected)
    assert float(mean_loss("mse")(logits, y)) == pytest.approx(float(expected.mean()))
    torch.testing.assert_close(
        per_example("cross_entropy")(logits, y), F.cross_entropy(logits, y, reduction="none")
    )


def test_mse_refuses_label_smoothing_in_one_line():
    with pytest.raises(
        UserError, match=r"trainer.label_smoothing=0.1 does not apply to trainer.loss=mse"
    ):
        per_example("mse", 0.1)
    with pytest.raises(
        UserError, match=r"trainer.loss='hinge' is unknown; choose one of cross_entropy, mse"
    ):
        per_example("hinge")


def test_a_run_with_mse_trains_evaluates_and_measures_with_it(tmp_path):
    """The test loss is the MSE of the final model, and λ_max is the MSE loss's Hessian's."""
    summary = train(compose(*TINY, "model=mlp", "trainer.loss=mse", "trainer.epochs=1"), tmp_path)
    assert summary["status"] == "completed"
    from sam_runner.data import build_data
    from sam_runner.models import build_model

    cfg = compose(*TINY, "model=mlp", "trainer.loss=mse", "trainer.epochs=1")
    data = build_data(cfg.dataset, torch.device("cpu"), 0)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["model"]
    model.load_state_dict(state)
    model.eval()
    xt, yt = data.test.x, data.test.y
    with torch.no_grad():
        mse = float(per_example("mse")(model(xt), yt).mean())
    assert summary["test_loss"] == pytest.approx(mse, rel=1e-5)
    x, y = data.train_subset(256, 0)
    from sam_runner.metrics import top_hessian_eigenvalues

    lam = top_hessian_eigenvalues(model, mean_loss("mse"), [(x, y)], tol=1e-6)[0]
    assert summary["lambda_max"] == pytest.approx(lam, rel=2e-3)
