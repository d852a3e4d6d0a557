"""Soft prompts (``model.peft=prompt``, Lester et al. 2021) on ``model=gpt``, our own code.

``length`` learned vectors in the embedding space are prepended to every window's token
embeddings; the prompt takes positions 0..P−1 of the position embeddings and the tokens
P..P+T−1, so P + T must fit the model's context. The model's output drops the prompt's positions:
the logits, the loss and every metric are those of the real tokens alone.

The vectors start as the embeddings of ``length`` token ids drawn at random from the vocabulary
(the "sampled vocabulary" start of Lester et al., which trains better than a random one there),
so the prompt starts inside the distribution the pretrained model has seen. They sit in the
token embedding (``embed.prompt.vectors`` in the state dict), beside the pretrained tensors,
whose names do not change.
"""

from __future__ import annotations

import torch
from torch import nn


class SoftPrompt(nn.Module):
    """``length`` learned vectors, prepended to ``[B, T, C]`` embeddings: ``[B, P + T, C]``."""

    def __init__(self, start: torch.Tensor):
        super().__init__()
        self.vectors = nn.Parameter(start.detach().clone())

    @property
    def length(self) -> int:
        return int(self.vectors.shape[0])

    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        prompt = self.vectors.to(embedded.dtype).expand(embedded.shape[0], -1, -1)
        return torch.cat([prompt, embedded], dim=1)


def add_prompt(model: nn.Module, length: int) -> SoftPrompt:
    """Give a GPT (``sam_runner.models.GPT``) a soft prompt of ``length`` vectors; returns it."""
    table = model.embed.tok.weight
    ids = torch.randint(table.shape[0], (length,), device=table.device)
    model.embed.prompt = prompt = SoftPrompt(table.detach()[ids])
    return prompt
