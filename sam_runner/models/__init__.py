"""Models. Input shape and class count come from the dataset.

Each model's top-level children are its functional blocks (stem, stages, head), with
normalisation layers inside the block of the layer they follow: the optimizer's
parameter groups (and GEAR-SAM's blocks) are read off this structure.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..circuits.circuit import ProbabilisticCircuit
from ..errors import UserError, integer, number, one_line, require
from ..registry import MODELS
from ..rundir import AVERAGED, CHECKPOINT
from ..runfiles import Checkpoint

if TYPE_CHECKING:
    from omegaconf import DictConfig

INPUTS = {
    "1d": "1-D signals (channels, length)",
    "image": "images (channels, height, width)",
    "tokens": "token sequences (dataset=text or dataset=modular_arithmetic)",
}
# the models that fit each kind of input, for the error that names them
FITTING = {
    "1d": "model=mlp or model=cnn1d",
    "image": "an image model (cnn, resnet18, ...) or model=mlp",
    "tokens": "model=gpt",
}
# model.activation of mlp, cnn and cnn1d (relu by default; tanh for edge-of-stability studies)
ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "gelu": nn.GELU}


def without_download(model_cfg: DictConfig) -> DictConfig:
    """The model's config with pretrained weights off: validation builds the architecture only (and
    sam-eval, which loads the run's own weights)."""
    if not model_cfg.get("pretrained", False):
        return model_cfg
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(model_cfg, resolve=True)
    out["pretrained"] = False
    return OmegaConf.create(out)


class Blocks(nn.Module):
    """A model that is its top-level children applied in order (its functional blocks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` through each block in turn."""
        for block in self.children():
            x = block(x)
        return x


class MLP(Blocks):
    """Flatten, one block per hidden Linear-activation layer (fc1, fc2, ...), a linear head."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        hidden: tuple[int, ...] = (256, 256),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        dims = [in_features, *hidden]
        self.flatten = nn.Flatten()
        for i, (a, b) in enumerate(zip(dims, dims[1:]), 1):
            self.add_module(f"fc{i}", nn.Sequential(nn.Linear(a, b), ACTIVATIONS[activation]()))
        self.head = nn.Linear(dims[-1], num_classes)


def _conv_bn(dim, cin, cout, k=3, stride=1, activation="relu", batchnorm=True):
    """Conv, BatchNorm (or a bias instead), activation."""
    conv, bn = (nn.Conv1d, nn.BatchNorm1d) if dim == 1 else (nn.Conv2d, nn.BatchNorm2d)
    act = nn.ReLU(inplace=True) if activation == "relu" else ACTIVATIONS[activation]()
    if not batchnorm:
        return nn.Sequential(conv(cin, cout, k, stride, k // 2), act)
    return nn.Sequential(conv(cin, cout, k, stride, k // 2, bias=False), bn(cout), act)


class SmallCNN(nn.Module):
    """Three conv-BN-activation stages (the last two downsampling), global average pool, linear
    head; without BatchNorm when ``batchnorm`` is false."""

    def __init__(
        self,
        dim: int,
        in_channels: int,
        num_classes: int,
        channels: int = 32,
        activation: str = "relu",
        batchnorm: bool = True,
    ) -> None:
        super().__init__()
        c, opts = channels, dict(activation=activation, batchnorm=batchnorm)
        self.stem = _conv_bn(dim, in_channels, c, k=5 if dim == 1 else 3, **opts)
        self.stage1 = _conv_bn(dim, c, 2 * c, stride=2, **opts)
        self.stage2 = _conv_bn(dim, 2 * c, 4 * c, stride=2, **opts)
        pool = nn.AdaptiveAvgPool1d(1) if dim == 1 else nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(pool, nn.Flatten(), nn.Linear(4 * c, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x``."""
        return self.head(self.stage2(self.stage1(self.stem(x))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))."""
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet (He et al. 2016): 3x3 stem, no max-pool, four stages."""

    def __init__(self, depths: tuple[int, ...], in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()
        )
        stages, cin = [], 64
        for i, (n, cout) in enumerate(zip(depths, (64, 128, 256, 512))):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x``."""
        return self.head(self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x))))))


class WideBlock(nn.Module):
    """Pre-activation wide block (BN-ReLU-conv twice), dropout between the convs."""

    def __init__(self, cin: int, cout: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.shortcut = (
            None if (stride == 1 and cin == cout) else nn.Conv2d(cin, cout, 1, stride, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output plus its shortcut (``x``, or a 1x1 conv of it)."""
        o = torch.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(o)
        o = self.conv1(o)
        o = self.conv2(self.dropout(torch.relu(self.bn2(o))))
        return o + skip


class WideResNet(nn.Module):
    """WRN-depth-width (Zagoruyko & Komodakis 2016) for 32x32 inputs."""

    def __init__(
        self, depth: int, width: int, in_channels: int, num_classes: int, dropout: float = 0.0
    ) -> None:
        super().__init__()
        require((depth - 4) % 6 == 0, f"WideResNet depth must be 6n+4, got {depth}")
        n, widths = (depth - 4) // 6, (16 * width, 32 * width, 64 * width)
        self.stem = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        cin, stages = 16, []
        for i, cout in enumerate(widths):
            stages.append(
                nn.Sequential(
                    *[
                        WideBlock(
                            cin if j == 0 else cout,
                            cout,
                            (1 if i == 0 else 2) if j == 0 else 1,
                            dropout,
                        )
                        for j in range(n)
                    ]
                )
            )
            cin = cout
        self.layer1, self.layer2, self.layer3 = stages
        self.head = nn.Sequential(
            nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(cin, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x``."""
        return self.head(self.layer3(self.layer2(self.layer1(self.stem(x)))))


# channels per conv layer, "M" a max-pool (the end of a stage)
VGG_CFG = {
    "vgg16_bn": "64 64 M 128 128 M 256 256 256 M 512 512 512 M 512 512 512 M".split(),
    "vgg19_bn": "64 64 M 128 128 M 256 256 256 256 M 512 512 512 512 M 512 512 512 512 M".split(),
}


class VGG(Blocks):
    """CIFAR-style VGG with BatchNorm: one block per pooling stage (stage1..stage5), one linear
    head.
    """

    def __init__(self, arch: str, in_channels: int, num_classes: int, spatial: int) -> None:
        super().__init__()
        layers, cin, size, stage = [], in_channels, spatial, 0
        for v in VGG_CFG[arch]:
            if v == "M":
                if size >= 2:  # small inputs (digits' 8x8) skip pools that would empty the map
                    layers.append(nn.MaxPool2d(2))
                    size //= 2
                stage += 1
                self.add_module(f"stage{stage}", nn.Sequential(*layers))
                layers = []
            else:
                v = int(v)
                layers += [
                    nn.Conv2d(cin, v, 3, padding=1, bias=False),
                    nn.BatchNorm2d(v),
                    nn.ReLU(inplace=True),
                ]
                cin = v
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)
        )


def auto_arch(input_shape: tuple[int, ...]) -> str:
    """model=auto: cnn1d for 1-D data, cnn for images under 32x32, resnet18 otherwise."""
    if len(input_shape) == 2:
        return "cnn1d"
    return "cnn" if min(input_shape[1:]) < 32 else "resnet18"


@MODELS.register(
    "mlp", "flatten, hidden layers (model.hidden, model.activation), linear head", inputs=None
)
def mlp(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=mlp: flatten, ``model.hidden`` layers, a linear head."""
    n = 1
    for d in input_shape:
        n *= d
    hidden = tuple(cfg.get("hidden", (256, 256)))
    require(
        all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden),
        f"model.hidden={list(hidden)} must be a list of layer widths >= 1, e.g. [256,256]",
    )
    return MLP(n, num_classes, hidden, _activation(cfg))


@MODELS.register(
    "pc",
    "a probabilistic circuit over discrete variables: log p(x) per example (trainer.loss=nll)",
    inputs=None,
)
def pc(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int | None) -> nn.Module:  # noqa: ARG001 (a density model has no classes)
    """model=pc: a probabilistic circuit over the flattened input's variables."""
    n = 1
    for d in input_shape:
        n *= d
    return ProbabilisticCircuit(
        n,
        categories=cfg.get("categories", 2),
        depth=cfg.get("depth", 3),
        sum_units=cfg.get("sum_units", 8),
        repetitions=cfg.get("repetitions", 4),
    )


def _activation(cfg: DictConfig) -> str:
    act = cfg.get("activation", "relu")
    require(
        act in ACTIVATIONS,
        f"model.activation={act!r} is unknown; choose one of {', '.join(ACTIVATIONS)}",
    )
    return act


def _cnn_options(cfg: DictConfig) -> dict:
    channels = integer(
        "model.channels", cfg.get("channels", 32), "an integer >= 1", lambda c: c >= 1
    )
    batchnorm = cfg.get("batchnorm", True)
    require(isinstance(batchnorm, bool), f"model.batchnorm={batchnorm!r} must be true or false")
    return dict(channels=channels, activation=_activation(cfg), batchnorm=batchnorm)


@MODELS.register(
    "cnn1d",
    "three conv-BN-activation stages, 1-D (model.channels, .activation, .batchnorm)",
    inputs="1d",
)
def cnn1d(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=cnn1d: the small CNN on 1-D signals."""
    return SmallCNN(1, input_shape[0], num_classes, **_cnn_options(cfg))


@MODELS.register(
    "cnn",
    "three conv-BN-activation stages, 2-D (model.channels, .activation, .batchnorm)",
    inputs="image",
)
def cnn(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=cnn: the small CNN on images."""
    return SmallCNN(2, input_shape[0], num_classes, **_cnn_options(cfg))


@MODELS.register("resnet18", "CIFAR-style ResNet-18 (3×3 stem, no max-pool)", inputs="image")
def resnet18(_cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=resnet18: CIFAR-style ResNet-18."""
    return ResNet((2, 2, 2, 2), input_shape[0], num_classes)


@MODELS.register("resnet34", "CIFAR-style ResNet-34 (3×3 stem, no max-pool)", inputs="image")
def resnet34(_cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=resnet34: CIFAR-style ResNet-34."""
    return ResNet((3, 4, 6, 3), input_shape[0], num_classes)


def _dropout(cfg: DictConfig) -> float:
    return number(
        "model.dropout", cfg.get("dropout", 0.0), "a probability in [0, 1)", lambda p: 0 <= p < 1
    )


@MODELS.register("wrn28_10", "Wide ResNet 28-10 (model.dropout)", inputs="image")
def wrn28_10(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=wrn28_10: Wide ResNet 28-10."""
    return WideResNet(28, 10, input_shape[0], num_classes, _dropout(cfg))


@MODELS.register("wrn16_8", "Wide ResNet 16-8 (model.dropout)", inputs="image")
def wrn16_8(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=wrn16_8: Wide ResNet 16-8."""
    return WideResNet(16, 8, input_shape[0], num_classes, _dropout(cfg))


@MODELS.register("vgg16_bn", "CIFAR-style VGG-16 with BatchNorm", inputs="image")
def vgg16_bn(_cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=vgg16_bn: CIFAR-style VGG-16 with BatchNorm."""
    return VGG("vgg16_bn", input_shape[0], num_classes, input_shape[1])


@MODELS.register("vgg19_bn", "CIFAR-style VGG-19 with BatchNorm", inputs="image")
def vgg19_bn(_cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=vgg19_bn: CIFAR-style VGG-19 with BatchNorm."""
    return VGG("vgg19_bn", input_shape[0], num_classes, input_shape[1])


@MODELS.register("vit_tiny", "ViT-Tiny (timm; model.patch_size, default 4)", inputs="image")
def vit_tiny(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=vit_tiny: timm's ViT-Tiny with ``model.patch_size`` patches."""
    from timm.models.vision_transformer import VisionTransformer

    patch = integer(
        "model.patch_size", cfg.get("patch_size", 4), "an integer >= 1", lambda p: p >= 1
    )
    require(
        input_shape[1] % patch == 0,
        f"model.patch_size={patch} must divide the image size {input_shape[1]}",
    )
    return VisionTransformer(
        img_size=input_shape[1],
        patch_size=patch,
        in_chans=input_shape[0],
        num_classes=num_classes,
        embed_dim=192,
        depth=12,
        num_heads=3,
    )


@MODELS.register("timm", "any timm model (model.name=..., model.pretrained=false)", inputs="image")
def timm_model(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=timm: the timm model ``model.name`` names (a one-line error when it is not one)."""
    import timm

    name = cfg.get("name")
    if name in (None, "???") or not timm.is_model(name):
        close = difflib.get_close_matches(str(name), timm.list_models(), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
        raise UserError(f"model.name={name!r} is not a timm model{hint}")
    local = cfg.get("pretrained_file")  # no hub here: timm loads a local file
    extra = {}
    if local not in (None, ""):
        require(
            Path(str(local)).is_file(),
            f"model.pretrained_file={local} does not exist; give a timm weights file",
        )
        extra = {"pretrained_cfg_overlay": dict(file=str(local))}
    try:
        return timm.create_model(
            name,
            pretrained=bool(cfg.get("pretrained", False)),
            num_classes=num_classes,
            in_chans=input_shape[0],
            **extra,
        )
    except Exception as e:
        raise UserError(
            f"model=timm model.name={name}: could not be built ({one_line(e)})"
        ) from None


class CausalSelfAttention(nn.Module):
    """Multi-head attention over earlier positions (``scaled_dot_product_attention``)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attention of ``x`` (``[B, T, C]``) over each position and the ones before it."""
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            for z in self.qkv(x).split(c, dim=2)
        )
        p = self.dropout if self.training else 0.0
        y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(LN(x)), then x + MLP(LN(x)) (GELU, 4x wide)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus attention, then plus the MLP."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TokenEmbedding(nn.Module):
    """Token plus position embeddings; with a soft prompt (``model.peft=prompt``,
    adapters/prompt.py) its vectors come first and take the first positions."""

    def __init__(self, vocab: int, context: int, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, n_embd), nn.Embedding(context, n_embd)
        self.drop = nn.Dropout(dropout)
        self.register_module("prompt", None)

    @property
    def prompt_length(self) -> int:
        """How many soft-prompt positions come first (0 without a prompt)."""
        return 0 if self.prompt is None else self.prompt.length

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Embeddings ``[B, T, C]`` of token ids ``idx`` (``[B, T]``), the prompt's first."""
        x = self.tok(idx)
        if self.prompt is not None:
            x = self.prompt(x)
        pos = torch.arange(x.shape[1], device=idx.device)
        return self.drop(x + self.pos(pos))


class GPT(nn.Module):
    """A small nanoGPT-style causal transformer: token and position embeddings, ``n_layer``
    pre-norm blocks (block1..), a final LayerNorm, and the output layer tied to the token
    embedding (the logits are h·Eᵀ, so the shared matrix is one parameter, counted once by
    SAM's norms, the Hessian and the parameter count). Returns ``[B, T, vocab]`` logits."""

    def __init__(
        self,
        vocab: int,
        context: int,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.context = context
        self.embed = TokenEmbedding(vocab, context, n_embd, dropout)
        for i in range(1, n_layer + 1):
            self.add_module(f"block{i}", TransformerBlock(n_embd, n_head, dropout))
        self.head = nn.LayerNorm(n_embd)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:  # GPT-2's: N(0, 0.02) weights, zero biases
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` of token ids ``idx`` (``[B, T]``)."""
        x = None
        for block in self.children():
            x = block(idx if x is None else x)
        # a soft prompt's positions give no logits: the loss and metrics are the tokens' alone
        return x[:, self.embed.prompt_length :] @ self.embed.tok.weight.t()


@MODELS.register(
    "gpt",
    "a small causal transformer, tied embeddings (model.n_layer, .n_head, .n_embd, .dropout)",
    inputs="tokens",
)
def gpt(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=gpt: the small causal transformer, its context ``model.block_size`` (or the data's)."""
    n_layer, n_head, n_embd = (
        integer(f"model.{k}", cfg.get(k, d), "an integer >= 1", lambda v: v >= 1)
        for k, d in (("n_layer", 4), ("n_head", 4), ("n_embd", 128))
    )
    require(
        n_embd % n_head == 0,
        f"model.n_embd={n_embd} must be a multiple of model.n_head={n_head}",
    )
    t = int(input_shape[0])
    context = cfg.get("block_size")
    context = t if context is None else integer("model.block_size", context, "an integer >= 1")
    require(
        t <= context,
        f"dataset.block_size={t} is larger than the model's context model.block_size={context}; "
        f"set model.block_size >= {t} (or null: the data's)",
    )
    return GPT(num_classes, context, n_layer, n_head, n_embd, _dropout(cfg))


@MODELS.register(
    "auto", "cnn1d for 1-D data, cnn for images under 32×32, resnet18 otherwise", inputs=None
)
def auto(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """model=auto: the model ``auto_arch`` picks for the input shape."""
    return build_model(cfg, input_shape, num_classes, auto_arch(tuple(input_shape)))


def build_model(
    cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int, arch: str | None = None
) -> nn.Module:
    """The model ``model.arch`` names (or ``arch``) for inputs of ``input_shape``."""
    entry = MODELS.entry(arch or cfg.arch)
    kind = {1: "tokens", 2: "1d", 3: "image"}.get(len(input_shape))
    if entry.inputs == "any":  # the model checks its inputs itself (model=hf, by its task)
        return entry.target(cfg, tuple(input_shape), num_classes)
    wrong = entry.inputs is not None and entry.inputs != kind
    if wrong or (entry.inputs is None and kind == "tokens"):  # an MLP on token ids: no
        needs = INPUTS[entry.inputs] if entry.inputs else "1-D signals or images"
        raise UserError(
            f"model={entry.name} needs {needs}, got {INPUTS.get(kind, 'shape')} "
            f"{tuple(input_shape)}; use {FITTING.get(kind, 'another model')}"
        )
    return entry.target(cfg, tuple(input_shape), num_classes)


# ---------------------------------------------------------------- blocks (sharding, checkpointing)
def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, in order: the units ``trainer.strategy=fsdp`` shards
    (``fully_shard`` on each, then the root) and ``trainer.activation_checkpointing``
    recomputes. One rule per family (docs/running.md): gpt its transformer blocks; resnet and
    wrn their residual stages (layer1..); vgg its pooling stages; mlp its hidden layers (fc1..);
    vit_tiny and timm models their ``blocks`` (or ``stages``, ``layers``, else numbered children
    ``layer1``.., ``stage1``.., ``block1``..); a Hugging Face model the modules its
    ``_no_split_modules`` names. cnn, cnn1d and pc declare none (an empty
    list)."""
    blocks = _own_blocks(model)
    inner = getattr(model, "base_model", None)  # a peft model: the wrapped model's blocks
    if not blocks and isinstance(inner, nn.Module) and inner is not model:
        return blocks_of(getattr(inner, "model", inner))
    return blocks


def _numbered(name: str, prefix: str) -> bool:
    return name.startswith(prefix) and name[len(prefix) :].isdigit()


def _own_blocks(model: nn.Module) -> list[nn.Module]:
    if isinstance(model, (SmallCNN, ProbabilisticCircuit)):  # cnn, cnn1d, pc: none declared
        return []
    children = dict(model.named_children())
    prefix = {GPT: "block", ResNet: "layer", WideResNet: "layer", VGG: "stage", MLP: "fc"}
    for family, start in prefix.items():
        if isinstance(model, family):
            return [m for n, m in children.items() if _numbered(n, start)]
    split = getattr(model, "_no_split_modules", None)  # Hugging Face transformers
    if split:
        names = set(split)
        return [m for m in model.modules() if type(m).__name__ in names]
    for name in ("blocks", "stages", "layers"):  # timm's VisionTransformer, ConvNeXt, Swin...
        group = children.get(name)
        if isinstance(group, (nn.Sequential, nn.ModuleList)) and len(group) > 0:
            return list(group)
    for start in ("layer", "stage", "block"):  # numbered children (timm's ResNets: layer1..)
        numbered = [m for n, m in children.items() if _numbered(n, start)]
        if numbered:
            return numbered
    return []


# ---------------------------------------------------------------- starting from given weights
INIT_WEIGHTS = {"last": CHECKPOINT, "averaged": AVERAGED}  # model.init_weights of a run folder
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP, AveragedModel, torch.compile


def init_path(model_cfg: DictConfig) -> Path | None:
    """The file ``model.init_from`` names: a run folder's checkpoints/last.pt (averaged.pt with
    ``model.init_weights=averaged``), a checkpoint file or a state_dict file; None when unset."""
    given = model_cfg.get("init_from")
    if given in (None, ""):
        return None
    weights = model_cfg.get("init_weights", "last")
    require(
        weights in INIT_WEIGHTS,
        f"model.init_weights={weights!r} is unknown; choose {' or '.join(INIT_WEIGHTS)}",
    )
    path = Path(str(given)).expanduser()
    if path.is_dir():
        path = path / INIT_WEIGHTS[weights]
    require(
        path.is_file(),
        f"model.init_from={given}: {path} does not exist (give a run folder, a checkpoint file "
        "or a state_dict file)",
    )
    return path


def initial_state(model_cfg: DictConfig) -> tuple[dict, dict] | None:
    """(the state dict ``model.init_from`` holds, a record of where it came from), or None."""
    path = init_path(model_cfg)
    if path is None:
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)  # data, never code
    except Exception as e:
        raise UserError(
            f"model.init_from={path} is not a readable torch file ({type(e).__name__})"
        ) from None
    nested = isinstance(obj, dict) and isinstance(obj.get("model"), dict)
    if nested and obj.get("sharded"):  # a sharded run's last.pt: its shards, assembled once
        obj = Checkpoint(path).load()
    state = obj["model"] if nested else obj
    require(
        isinstance(state, dict) and state and all(torch.is_tensor(v) for v in state.values()),
        f"model.init_from={path} holds no state dict (a mapping of names to tensors)",
    )
    for prefix in WRAPPER_PREFIXES:
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    state.pop("n_averaged", None)
    record = {
        "path": str(path.resolve()),
        "kind": "checkpoint" if nested else "state_dict",
        "reset_head": bool(model_cfg.get("reset_head", False)),
    }
    if nested and "epoch" in obj:
        record["epoch"] = int(obj["epoch"])
    return state, record


def classifier_name(model: nn.Module) -> str | None:
    """The classifier's module name: timm's ``get_classifier()``, else the last Linear."""
    target = model.get_classifier() if hasattr(model, "get_classifier") else None
    name = None
    for n, m in model.named_modules():
        if (m is target) if target is not None else isinstance(m, nn.Linear):
            name = n
    return name


def _fitting(state: dict, own: dict, path, skip: str | None, head: str | None = None) -> dict:
    """``state`` without the skipped classifier, or a one-line error naming the first tensor
    that does not fit ``own`` (the model's state dict); ``model.reset_head`` is suggested only
    where that tensor is the classifier's (``head``)."""
    skipped = lambda k: skip is not None and k.startswith(f"{skip}.")
    kept = {k: v for k, v in state.items() if not skipped(k)}
    for k, v in own.items():
        if skipped(k):
            continue
        require(k in kept, f"model.init_from={path} does not fit this model: it has no {k}")
        if tuple(kept[k].shape) != tuple(v.shape):
            in_head = head is not None and k.startswith(f"{head}.")
            hint = (
                "another class count: model.reset_head=true"
                if in_head
                else "another width or architecture: the model's keys must match the source's"
            )
            raise UserError(
                f"model.init_from={path} does not fit this model: {k} is "
                f"{list(kept[k].shape)} there and {list(v.shape)} here ({hint})"
            )
    extra = next((k for k in kept if k not in own), None)
    require(extra is None, f"model.init_from={path} does not fit this model: {extra} is not in it")
    return kept


def load_initial_weights(model_cfg: DictConfig, model: nn.Module) -> dict | None:
    """Load ``model.init_from``'s weights into ``model`` (with ``model.reset_head``, all but the
    classifier, which keeps its fresh initialisation); returns where they came from."""
    found = initial_state(model_cfg)
    if found is None:
        return None
    state, record = found
    skip = classifier_name(model) if record["reset_head"] else None
    own = model.state_dict()
    kept = _fitting(state, own, record["path"], skip, classifier_name(model))
    model.load_state_dict({**own, **kept})
    return record


def check_initial_weights(
    model_cfg: DictConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    classes_known: bool = True,
) -> None:
    """Preflight: ``model.init_from`` exists and fits the model (built on the meta device); the
    classifier is not compared when the class count is not known before the data is read."""
    found = initial_state(model_cfg)
    if found is None:
        return
    state, record = found
    with torch.device("meta"):
        model = build_model(model_cfg, input_shape, num_classes)
    head = record["reset_head"] or not classes_known
    name = classifier_name(model)
    _fitting(state, model.state_dict(), record["path"], name if head else None, name)
