"""sam-runner: an experiment runner for flatness studies (SAM variants, calibration, sharpness)."""

__version__ = "0.1.0"


def _register_resolvers() -> None:
    """Resolvers the config tree itself uses (registered on import: every process that composes
    or reads a run's config imports the package first)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("sam_runner_sharded"):
        # optimizer.sync_perturbation's default: true under trainer.strategy=fsdp, else false
        OmegaConf.register_new_resolver("sam_runner_sharded", lambda s: str(s) == "fsdp")


_register_resolvers()
