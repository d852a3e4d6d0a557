"""The registries: one-line errors, and a config option for every entry (and the reverse)."""

from pathlib import Path

import pytest

from sam_runner.errors import UserError
from sam_runner.registry import ALL, VARIANTS, Registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("key", [k for k in ALL if "." not in k])
def test_every_entry_has_its_yaml_and_every_yaml_an_entry(key):
    yamls = {p.stem for p in (ROOT / "conf" / key).glob("*.yaml")}
    assert yamls == set(ALL[key]), f"conf/{key}/ and the {key} registry differ"


def test_unknown_names_are_one_line_with_the_nearest_and_the_choices():
    with pytest.raises(UserError) as e:
        VARIANTS.entry("gearsam")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("optimizer='gearsam' is unknown (did you mean gear_sam?)")
    assert message.endswith("; choose one of " + ", ".join(sorted(VARIANTS)))


def test_a_class_states_its_metadata_once_and_a_name_is_registered_once():
    registry = Registry("thing", "sam_runner.registry", attributes=("passes",), has_rho=True)

    @registry.register("two", "a two-pass thing")
    class Two:
        passes = 2

    entry = registry.entry("two")
    assert (entry.passes, entry.has_rho, entry.description) == (2, True, "a two-pass thing")
    assert registry.entry_of(Two) is entry and registry.names_where(passes=2) == ["two"]
    with pytest.raises(ValueError, match="thing=two is registered twice"):
        registry.register("two", "another", target=object)


def test_what_readers_know_of_the_variants_without_them_is_the_registrys():
    # sam-report tells which variants have a ρ from rundir.NO_RHO, without importing torch
    from sam_runner.rundir import NO_RHO, has_rho

    assert set(NO_RHO) == {e.name for e in VARIANTS.entries() if not e.has_rho}
    # ... and the variants' colours from conf/optimizer/*.yaml
    from sam_runner.plots.style import variant_names

    assert variant_names() == tuple(sorted(VARIANTS))
    assert [has_rho(n) for n in ("base", "sam", "a_variant_of_a_newer_runner")] == [
        False,
        True,
        True,
    ]


def test_the_readme_option_table_is_the_registries():
    from sam_runner.help import markdown_options

    readme = (ROOT / "README.md").read_text()
    start, end = "<!-- options: python -m sam_runner.help -->\n", "\n<!-- /options -->"
    assert start in readme and end in readme, "README.md lacks the options markers"
    table = readme.split(start, 1)[1].split(end, 1)[0]
    assert table == markdown_options(), (
        "README's option table is stale: paste the output of `python -m sam_runner.help`"
    )
