"""SAMTrainer with the real ``transformers`` on a tiny model built from its config: equal to the
variant's own ``step(closure)`` loop over the same micro-batches (gradient accumulation), in fp32
and under bf16 autocast; the variant's state in the Trainer's checkpoint; one-line refusals."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from sam_runner.errors import UserError  # noqa: E402
from sam_runner.integrations import SAMTrainer  # noqa: E402
from sam_runner.optim import SAM, VARIANTS  # noqa: E402


def _model(seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


class _Rows(torch.utils.data.Dataset):
    def __init__(self, n=24, length=8):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 50, (n, length), generator=g)
        self.labels = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class _Recording(SAMTrainer):
    """Records the micro-batches the Trainer hands to training_step, in order."""

    seen: list

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen.append({k: v.clone() for k, v in inputs.items()})
        return super().training_step(model, inputs, num_items_in_batch)


def _train(tmp_path, variant="sam", steps=3, accumulate=2, bf16=False, **kw):
    model = _model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulate, max_steps=steps, learning_rate=1e-2,
        weight_decay=0.01, lr_scheduler_type="constant",
        max_grad_norm=0.0, use_cpu=True, bf16=bf16, report_to=[], save_strategy="no", seed=0,
        logging_steps=1, dataloader_drop_last=True,
    )  # fmt: skip
    trainer = _Recording(model=model, args=args, train_dataset=_Rows(), variant=variant, **kw)
    trainer.seen = []
    trainer.train()
    return trainer, model


def _by_hand(trainer, variant="sam", accumulate=2, bf16=False, variant_kwargs=None):
    """The variant's own loop over the micro-batches the Trainer saw: one step(closure) per
    ``accumulate`` of them, AdamW over the Trainer's two groups, each micro-batch's loss scaled
    as the Trainer scales it (by 1/accumulate, unless the model takes the batch's item count and
    normalises by it itself, as transformers assumes of a model accepting loss keywords)."""
    seen = trainer.seen
    scale = 1.0 if trainer.model_accepts_loss_kwargs else 1 / accumulate
    model = _model()
    decay = [p for n, p in model.named_parameters() if "bias" not in n and "LayerNorm" not in n]
    rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    opt = VARIANTS[variant](groups, torch.optim.AdamW, lr=1e-2, **(variant_kwargs or {}))
    opt.bind(model=model)
    for k in range(0, len(seen), accumulate):
        window = seen[k : k + accumulate]

        def closure():
            opt.zero_grad()
            total = 0.0
            for micro in window:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(**micro).loss * scale
                loss.backward()
                total += loss.detach()
            return total

        opt.step(closure)
    return model


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("variant", ["sam", "gsam", "wsam"])
def test_sam_trainer_equals_the_variants_own_loop(tmp_path, variant):
    trainer, model = _train(tmp_path, variant=variant)
    assert len(trainer.seen) == 6 and trainer.variant.step_count == 3
    want = _by_hand(trainer, variant=variant)
    assert torch.equal(_flat(model), _flat(want))  # bit for bit
    assert trainer.variant.summary_values()["grad_evals_per_step"] == 2.0


def test_sam_trainer_under_bf16_autocast_equals_the_same_loop(tmp_path):
    trainer, model = _train(tmp_path, bf16=True)
    want = _by_hand(trainer, bf16=True)
    torch.testing.assert_close(_flat(model), _flat(want), rtol=1e-4, atol=1e-5)


def test_a_given_optimizer_must_be_a_variant(tmp_path):
    model = _model()
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(UserError, match="must be a SAM variant.*got SGD"):
        SAMTrainer(model=model, args=args, train_dataset=_Rows(),
                   optimizers=(torch.optim.SGD(model.parameters(), lr=0.1), None))  # fmt: skip
    variant = SAM(model.parameters(), torch.optim.SGD, lr=0.1)
    trainer = SAMTrainer(model=model, args=args, train_dataset=_Rows(), optimizers=(variant, None))
    assert trainer.variant is variant


def test_variants_that_need_the_loss_hooks_are_refused(tmp_path):
    with pytest.raises(UserError, match="cannot run esam"):
        _train(tmp_path, variant="esam")


def test_the_trainers_checkpoint_holds_the_variants_state(tmp_path):
    model = _model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, use_cpu=True,
        report_to=[], save_strategy="steps", save_steps=2, learning_rate=1e-2,
    )  # fmt: skip
    trainer = SAMTrainer(model=model, args=args, train_dataset=_Rows(), variant="fsam")
    trainer.train()
    saved = torch.load(tmp_path / "checkpoint-2" / "optimizer.pt", weights_only=False)
    assert saved["variant"]["step_count"] == 2 and "base" in saved
    assert any("fsam_momentum" in s for s in saved["state"].values())
