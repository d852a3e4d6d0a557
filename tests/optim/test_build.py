"""From config to optimizer: optimizer=base composes and builds with or without optimizer.rho."""

import torch
from conftest import compose
from optim_helpers import closure_for, flat, mlp, ref_grad

from sam_runner.optim.build import build_optimizer


def test_base_builds_with_rho_null_and_ignores_a_swept_rho():
    """`optimizer=base optimizer.rho=0.1` composes (rho: null in base.yaml; a sweep
    `optimizer=base,sam optimizer.rho=...` needs it) and base stays one plain base step."""
    assert compose("optimizer=base").optimizer.rho is None
    for overrides in ((), ("optimizer.rho=0.1",)):
        cfg = compose(
            "optimizer=base",
            "base_optimizer=sgd",
            "base_optimizer.lr=0.1",
            "base_optimizer.momentum=0",
            "base_optimizer.weight_decay=0",
            *overrides,
        )
        model = mlp()
        opt = build_optimizer(cfg, model, 10).bind(model=model)
        assert type(opt).__name__ == "Base"
        theta, calls = flat(model.parameters()), []
        opt.step(closure_for(opt, model, calls=calls))
        _, g = ref_grad(model, theta)
        assert calls == [0]
        torch.testing.assert_close(
            flat(model.parameters()), theta - 0.1 * g, rtol=1e-12, atol=1e-15
        )
        assert "rho" not in opt.log_values()


def test_every_variant_option_is_a_key_of_its_yaml_with_the_class_default():
    """So that each can be set as ``optimizer.<key>=...`` (``+`` is refused), shows in ``--cfg
    job`` and in the run's settings; the yaml's value is the class's default."""
    from omegaconf import OmegaConf

    from sam_runner.registry import VARIANTS

    for name in VARIANTS:
        cfg = compose(f"optimizer={name}").optimizer
        for key, default in VARIANTS[name].variant_options.items():
            assert key in cfg, f"conf/optimizer/{name}.yaml lacks {key}"
            assert OmegaConf.to_object(cfg)[key] == default, (name, key)


def test_a_variant_option_set_from_the_command_line_reaches_the_optimizer():
    model = mlp()
    cfg = compose("optimizer=tlc_sam", "optimizer.tau_beta=0.5", "optimizer.delta=1e-6")
    opt = build_optimizer(cfg, model, 10)
    assert (opt.tau_beta, opt.delta) == (0.5, 1e-6)


def test_the_runners_torch_base_optimizers_update_a_group_in_one_multi_tensor_call():
    """foreach on the CPU (fused on CUDA: torch's fused kernels); the groups are Muon's matrices
    and the rest; a foreach SGD step equals torch's per-tensor loop bit for bit."""
    from sam_runner.optim.base import Base
    from sam_runner.optim.build import parameter_groups

    for name in ("sgd", "adamw"):
        model = mlp()
        opt = build_optimizer(compose(f"base_optimizer={name}"), model, 10)
        assert opt.base_optimizer.defaults["foreach"] is True
        assert [g["use_muon"] for g in opt.param_groups] == [True, False]
    model, twin = mlp(), mlp()
    ours = build_optimizer(compose("optimizer=base", "base_optimizer=sgd"), model, 10)
    ours.bind(model=model)
    sgd = dict(lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=False)
    loop = Base(parameter_groups(twin), torch.optim.SGD, foreach=False, **sgd).bind(model=twin)
    for _ in range(3):
        ours.step(closure_for(ours, model))
        loop.step(closure_for(loop, twin))
    assert torch.equal(flat(model.parameters()), flat(twin.parameters()))
