"""The Lightning pattern of docs/variants.md#from-python with the real ``lightning``: manual
optimization, the variant's ``step`` given a closure that calls ``manual_backward``; equal bit
for bit to the variant's own loop on the same model, seed and batches; ``first_step`` /
``second_step`` around two ``manual_backward`` calls likewise."""

import pytest
import torch
import torch.nn.functional as F

L = pytest.importorskip("lightning")

from sam_runner.optim import SAM  # noqa: E402


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)


class SAMModule(L.LightningModule):
    """The pattern: manual optimization, the variant's passes in ``training_step``."""

    def __init__(self, two_calls=False):
        super().__init__()
        self.net, self.two_calls = _net(), two_calls
        self.automatic_optimization = False

    def configure_optimizers(self):
        return SAM(self.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)

    def training_step(self, batch, batch_idx):  # noqa: ARG002 (Lightning's signature)
        x, y = batch
        opt = self.optimizers()
        if self.two_calls:  # davda54's two calls
            self.manual_backward(F.cross_entropy(self.net(x), y))
            opt.optimizer.first_step(zero_grad=True)
            self.manual_backward(F.cross_entropy(self.net(x), y))
            opt.optimizer.second_step(zero_grad=True)
            return None

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(self.net(x), y)
            self.manual_backward(loss)
            return loss

        return opt.step(closure=closure)


def _lightning(two_calls):
    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    module = SAMModule(two_calls)
    trainer = L.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, loader)
    return torch.cat([p.detach().reshape(-1) for p in module.net.parameters()])


def _own_loop():
    x, y = _data()
    net = _net()
    opt = SAM(net.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    for xb, yb in zip(x.split(8), y.split(8)):

        def closure(xb=xb, yb=yb):
            opt.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            return loss

        opt.step(closure)
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


@pytest.mark.parametrize("two_calls", [False, True], ids=["closure", "first_second_step"])
def test_the_lightning_pattern_equals_the_variants_own_loop(two_calls):
    assert torch.equal(_lightning(two_calls), _own_loop())
