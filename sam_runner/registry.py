"""Everything a config chooses by name, in one pattern.

A ``Registry`` maps the names a user writes (``optimizer=gear_sam``, ``model=resnet18``) to
what they build, with a one-line description and metadata (whether a variant has a ρ, which
input a model takes, which keys a measure logs). Entries register themselves where they are
defined::

    @VARIANTS.register("sam", "ε = ρ g/‖g‖ (Foret et al. 2021)")
    class SAM(SharpnessAware): ...

and a registry imports the package that defines its entries the first time it is read, so
adding an entry means adding its module (and its yaml): nothing else is edited. From the
registries come the "choose one of" errors, the option lists of ``sam-run --help`` and the
option table of the README (checked against them by a test).

This module imports nothing heavy: ``sam-report`` reads the registries without building models.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from .errors import UserError


@dataclass(frozen=True)
class Entry:
    """One registered choice: its name, what it builds, its line of help, its metadata (read as
    attributes: ``entry.has_rho``)."""

    name: str
    target: object  # the class or function the name builds
    description: str  # one line, for --help and the README
    meta: dict = field(default_factory=dict)

    def __getattr__(self, key: str) -> object:  # entry.has_rho: the metadata, read like attributes
        try:
            return self.__dict__["meta"][key]
        except KeyError:
            raise AttributeError(key) from None


class Registry(Mapping):
    """``name -> target`` (a read-only mapping), plus each entry's description and metadata.

    ``key`` is how a config names the choice (``optimizer``, ``dataset.sampler``): errors say
    ``optimizer='x' is unknown``. ``package`` is imported, every module in it, before the first
    lookup. ``defaults`` are the metadata an entry has unless it says otherwise; ``attributes``
    are metadata read off the registered class itself (a SAM variant's ``passes``: the class
    states it once, for its own code and for the registry alike).
    """

    def __init__(
        self, key: str, package: str, attributes: tuple[str, ...] = (), **defaults: object
    ):
        self.key, self.package, self.defaults, self.attributes = key, package, defaults, attributes
        self._entries: dict[str, Entry] = {}
        self._loaded = False

    def register(
        self, name: str, description: str, target: object = None, **meta: object
    ) -> Callable | object:
        """Register ``target`` under ``name``; used bare it decorates the class or function
        below.

        Args:
            name: what a config writes (``optimizer=NAME``).
            description: one line, for ``--help`` and the README's option table.
            target: the class or function the name builds; None: the decorated one.
            meta: the entry's metadata (over the registry's defaults).

        Returns:
            ``target``, or the decorator that registers and returns its argument.
        """

        def add(obj: object) -> object:
            """Register ``obj`` and return it unchanged."""
            if name in self._entries and self._entries[name].target is not obj:
                raise ValueError(f"{self.key}={name} is registered twice")
            own = {k: getattr(obj, k) for k in self.attributes}
            self._entries[name] = Entry(name, obj, description, {**self.defaults, **own, **meta})
            return obj

        return add if target is None else add(target)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        package = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
            importlib.import_module(f"{self.package}.{info.name}")

    def entry(self, name: str) -> Entry:
        """The entry called ``name``, or a one-line error naming the choices (and the nearest)."""
        self._load()
        if name in self._entries:
            return self._entries[name]
        near = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UserError(
            f"{self.key}={name!r} is unknown{hint}; choose one of "
            f"{', '.join(sorted(self._entries))}"
        )

    def entry_of(self, target: object) -> Entry | None:
        """The entry registered for ``target`` (a class or function), or None."""
        return next((e for e in self.entries() if e.target is target), None)

    def entries(self) -> list[Entry]:
        """Every entry, by name."""
        self._load()
        return [self._entries[k] for k in sorted(self._entries)]

    def build(self, name: str, *args: object, **kwargs: object) -> object:
        """``target(*args, **kwargs)`` of the entry called ``name``."""
        return self.entry(name).target(*args, **kwargs)

    def names_where(self, **meta: object) -> list[str]:
        """The names whose metadata has every given value."""
        return [e.name for e in self.entries() if all(e.meta.get(k) == v for k, v in meta.items())]

    def __getitem__(self, name: str) -> object:
        self._load()
        return self._entries[name].target

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(sorted(self._entries))

    def __len__(self):
        self._load()
        return len(self._entries)


# Every registry of the project, by the config key that chooses from it.
VARIANTS = Registry(
    "optimizer",
    "sam_runner.optim",
    attributes=("passes", "has_rho", "rho_refused", "replaces_lr", "ignored_options"),
)
BASE_OPTIMIZERS = Registry("base_optimizer", "sam_runner.optim.base_optimizers")
SCHEDULERS = Registry("scheduler", "sam_runner.schedulers")
MODELS = Registry("model", "sam_runner.models")
DATASETS = Registry("dataset", "sam_runner.data.sources", tensors=True, augmented=False)
SAMPLERS = Registry("dataset.sampler", "sam_runner.samplers")
LOGGERS = Registry("logger", "sam_runner.loggers")
MEASURES = Registry("metrics", "sam_runner.metrics.measures")
LOSSES = Registry("trainer.loss", "sam_runner.losses")
AUGMENTS = Registry("dataset.augment", "sam_runner.data.augment", basic=True)
WEIGHT_AVERAGING = Registry("trainer.weight_averaging", "sam_runner.averaging")
REGULARIZERS = Registry("regularizer", "sam_runner.regularizers")
WEIGHT_DECAYS = Registry("weight_decay", "sam_runner.weight_decay")
# not in ALL yet: README's option table (generated from ALL, checked by a test) lists it first
FEDERATED = Registry("federated", "sam_runner.federated.algorithms")
CORRUPTIONS = Registry("metrics.corruptions.names", "sam_runner.data.corruptions", monotone=None)

ALL = {
    r.key: r
    for r in (
        *(DATASETS, MODELS, BASE_OPTIMIZERS, VARIANTS, SCHEDULERS, LOGGERS, SAMPLERS, LOSSES),
        *(AUGMENTS, WEIGHT_AVERAGING, REGULARIZERS, WEIGHT_DECAYS, FEDERATED),
    )
}
