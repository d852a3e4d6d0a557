"""Models: shapes from the dataset, functional blocks as top-level children, clear errors."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from sam_runner.errors import UserError
from sam_runner.models import build_model
from sam_runner.optim.build import parameter_groups

CASES = [
    ("mlp", (1, 40)),
    ("cnn1d", (1, 40)),
    ("cnn", (3, 32, 32)),
    ("resnet18", (3, 32, 32)),
    ("resnet34", (3, 32, 32)),
    ("wrn16_8", (3, 32, 32)),
    ("vgg16_bn", (3, 32, 32)),
    ("vgg19_bn", (1, 8, 8)),
    ("vit_tiny", (3, 32, 32)),
    ("resnet18", (1, 8, 8)),
]


@pytest.mark.parametrize(
    "arch,shape", CASES, ids=[f"{a}-{'x'.join(map(str, s))}" for a, s in CASES]
)
def test_forward_shape(arch, shape):
    model = build_model(OmegaConf.create({"arch": arch}), shape, 7)
    out = model(torch.randn(2, *shape))
    assert out.shape == (2, 7)


def test_wrn28_10_size():
    model = build_model(OmegaConf.create({"arch": "wrn28_10"}), (3, 32, 32), 100)
    n = sum(p.numel() for p in model.parameters())
    assert 36.4e6 < n < 36.6e6  # the published WRN-28-10 has 36.5M parameters


def test_resnet18_cifar_stem_has_no_maxpool():
    model = build_model(OmegaConf.create({"arch": "resnet18"}), (3, 32, 32), 10)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert model.stem[0].kernel_size == (3, 3) and model.stem[0].stride == (1, 1)
    assert 11.1e6 < sum(p.numel() for p in model.parameters()) < 11.3e6


def test_timm_by_name():
    model = build_model(
        OmegaConf.create({"arch": "timm", "name": "resnet10t", "pretrained": False}), (3, 32, 32), 5
    )
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_unknown_timm_name_suggests_close_matches():
    with pytest.raises(UserError, match=r"model.name='convnext_atoo'.*convnext_atto"):
        build_model(OmegaConf.create({"arch": "timm", "name": "convnext_atoo"}), (3, 32, 32), 5)


def test_image_model_on_1d_data_is_one_line():
    with pytest.raises(UserError, match="model=resnet18 needs images"):
        build_model(OmegaConf.create({"arch": "resnet18"}), (1, 40), 10)


def _structure(groups) -> dict:
    """id(parameter) -> (block, kind, hidden, use_muon), from the groups' per-parameter lists."""
    return {
        id(p): (b, k, h, g["use_muon"])
        for g in groups
        for p, b, k, h in zip(g["params"], g["blocks"], g["kinds"], g["hidden_flags"])
    }


def test_groups_are_few_with_blocks_and_norm_weights_in_their_layer():
    model = build_model(OmegaConf.create({"arch": "resnet18"}), (3, 32, 32), 10)
    groups = parameter_groups(model)
    assert len(groups) == 1  # no 2-D hidden matrix (no Muon group): one launch per foreach op
    structure = _structure(groups)
    blocks = [structure[id(p)][0] for p in model.parameters()]
    assert blocks[0] == "stem" and blocks[-1] == "head"
    assert {"layer1", "layer2", "layer3", "layer4"} <= set(blocks)
    stem_bn = model.stem[1]
    assert structure[id(stem_bn.weight)][:2] == ("stem", "weight"), "a BN weight is its layer's"
    assert structure[id(stem_bn.bias)][:2] == ("stem", "bias")
    every = [p for g in groups for p in g["params"]]
    assert len(every) == len(list(model.parameters())) == len({id(p) for p in every})
    assert not any(h for b, k, h, _ in structure.values() if b in ("stem", "head") or k == "bias")
    gpt = build_model(OmegaConf.create({"arch": "gpt"}), (16,), 256)
    assert [g["use_muon"] for g in parameter_groups(gpt)] == [True, False]  # Muon's, the rest
    assert all(p.ndim == 2 for p in parameter_groups(gpt)[0]["params"])


def _flags(model):
    """Parameter names flagged hidden and use_muon by the runner's groups."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = parameter_groups(model)
    every = [names[id(p)] for g in groups for p in g["params"]]
    assert sorted(every) == sorted(names.values())  # each parameter once
    hidden = {names[id(p)] for g in groups for p, h in zip(g["params"], g["hidden_flags"]) if h}
    muon = {names[id(p)] for g in groups if g["use_muon"] for p in g["params"]}
    return hidden, muon


def _weights(model, *types):
    return [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, types)]


def test_hidden_is_every_linear_and_conv_weight_but_the_input_layer_and_the_head():
    conv = (torch.nn.Conv1d, torch.nn.Conv2d)
    mlp = build_model(OmegaConf.create({"arch": "mlp"}), (1, 40), 10)
    assert [n for n, _ in mlp.named_children()] == ["flatten", "fc1", "fc2", "head"]
    assert _flags(mlp) == ({"fc2.0.weight"}, {"fc2.0.weight"})  # fc1 (input) and head excluded
    cnn1d = build_model(OmegaConf.create({"arch": "cnn1d"}), (1, 40), 10)
    # conv kernels: not Muon's
    assert _flags(cnn1d) == (
        {"stage1.0.weight", "stage2.0.weight"},
        set(),
    )
    resnet = build_model(OmegaConf.create({"arch": "resnet18"}), (3, 8, 8), 10)
    convs = _weights(resnet, *conv)
    assert convs[0] == "stem.0.weight" and len(convs) == 20
    assert _flags(resnet) == (set(convs[1:]), set())  # shortcut convs included, head excluded
    vgg = build_model(OmegaConf.create({"arch": "vgg16_bn"}), (3, 8, 8), 10)
    assert [n for n, _ in vgg.named_children()] == [f"stage{i}" for i in range(1, 6)] + ["head"]
    convs = _weights(vgg, *conv)
    assert convs[0] == "stage1.0.weight" and len(convs) == 13
    assert _flags(vgg) == (set(convs[1:]), set())
    assert {b for b, _, h, _ in _structure(parameter_groups(vgg)).values() if h} == {
        f"stage{i}" for i in range(1, 6)
    }


def test_vit_tokens_embeddings_and_norms_are_not_hidden():
    vit = build_model(OmegaConf.create({"arch": "vit_tiny", "patch_size": 4}), (3, 8, 8), 10)
    hidden, muon = _flags(vit)
    linears = _weights(vit, torch.nn.Linear)
    # qkv, proj, fc1, fc2 per block
    assert linears[-1] == "head.weight" and len(linears) == 12 * 4 + 1
    assert hidden == muon == set(linears[:-1])  # the patch conv is the input layer
    assert not hidden & {"cls_token", "pos_embed", "patch_embed.proj.weight", "norm.weight"}


def test_auto_fits_the_dataset():
    auto = OmegaConf.create({"arch": "auto", "channels": 8})
    assert isinstance(build_model(auto, (1, 40), 10), torch.nn.Module)
    # resnet18 on CIFAR
    assert isinstance(build_model(auto, (3, 32, 32), 100).layer4, torch.nn.Sequential)
    assert build_model(auto, (1, 8, 8), 10).stem[0].kernel_size == (3, 3)  # the small cnn on digits
    assert type(build_model(auto, (1, 40), 10).stem[0]).__name__ == "Conv1d"


def test_timm_takes_a_local_pretrained_file_and_adapts_the_classifier(tmp_path):
    """No hub here: model.pretrained_file goes to timm's own loader (pretrained_cfg_overlay)."""
    import timm

    source = timm.create_model("test_byobnet", num_classes=7)
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)
    cfg = OmegaConf.create(
        dict(arch="timm", name="test_byobnet", pretrained=True, pretrained_file=str(path))
    )
    model = build_model(cfg, (3, 32, 32), 5)
    assert model.get_classifier().out_features == 5
    for k, v in model.state_dict().items():
        if not k.startswith("head."):
            assert torch.equal(v, source.state_dict()[k]), k
    with pytest.raises(UserError, match="model.pretrained_file=.*does not exist"):
        build_model(OmegaConf.merge(cfg, {"pretrained_file": str(tmp_path / "no")}), (3, 32, 32), 5)


def test_reset_head_finds_the_classifier_of_timm_and_of_our_models():
    from sam_runner.models import classifier_name

    cnn = build_model(OmegaConf.create({"arch": "cnn"}), (3, 8, 8), 10)
    vit = build_model(OmegaConf.create({"arch": "vit_tiny", "patch_size": 4}), (3, 8, 8), 10)
    assert classifier_name(cnn) == "head.2" and classifier_name(vit) == "head"
