"""Flavor registry: lookup, duplicates, analytic parameter counts, coverage of the baselines."""

import csv
import dataclasses
from pathlib import Path

import pytest
import torch

from workloads import flavors
from workloads.config import ModelSpec, SpecError
from workloads.flavors import FLAVORS, find_flavors, get_flavor, parameter_count, register
from workloads.models import build_model

# A copy of the project's shared data/published_baselines.csv, kept with the baselines.
BASELINES_CSV = Path(__file__).resolve().parents[2] / "results" / "baselines" / "published_baselines.csv"


def test_get_flavor_returns_named_spec():
    spec = get_flavor("llama3.1-405b")
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads) == (126, 16384, 128, 8)


def test_unknown_flavor_names_field_and_close_matches():
    with pytest.raises(SpecError, match=r"model\.name='llama3-7b'.*llama3-70b"):
        get_flavor("llama3-7b")


def test_register_refuses_duplicate(monkeypatch):
    monkeypatch.setattr(flavors, "FLAVORS", dict(FLAVORS))
    with pytest.raises(SpecError, match="already a registered flavor"):
        register(get_flavor("gpt-debug"))


def test_register_adds_new_name(monkeypatch):
    monkeypatch.setattr(flavors, "FLAVORS", dict(FLAVORS))
    spec = ModelSpec(name="tiny", family="gpt", layers=1, hidden=8, ffn_hidden=32, heads=2,
                     kv_heads=2, vocab=16, positions="learned")  # fmt: skip
    register(spec)
    assert flavors.get_flavor("tiny") is spec


def test_names_are_lowercase_family_size():
    for name, spec in FLAVORS.items():
        assert name == spec.name and name == name.lower() and "-" in name


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama3-70b", 70.6e9),  # Llama 3 model card
        ("llama3.1-405b", 405.9e9),  # Dubey et al. 2024 (405B; HF safetensors total 405.85 B)
        ("gpt3-175b", 174.6e9),  # Brown et al. 2020 (175.0 B rounded)
        ("llama2-7b", 6.74e9),  # Touvron et al. 2023 (6 738 415 616 in the HF checkpoint)
        ("llama3-8b", 8.03e9),  # Llama 3 model card
        ("bloom-176b", 176.25e9),  # bigscience/bloom model card: 176 247 271 424
        ("gpt2-124m", 124.4e6),  # llm.c (124 M with 50257 vocab)
    ],
)
def test_parameter_count_matches_published(name, published):
    assert parameter_count(get_flavor(name)) == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("name", sorted(FLAVORS))
def test_meta_model_parameter_count_equals_formula(name):
    # two of its layers: every layer is the same module, and the formula is linear in them
    # (the 96-layer flavors took 3-5 s each to build on CI's loaded cores, 0.05 s with two)
    spec = dataclasses.replace(FLAVORS[name], layers=2)
    with torch.device("meta"):
        model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(spec)


def test_the_formula_is_linear_in_the_layers_of_a_whole_model():
    spec = FLAVORS["llama3-8b"]
    with torch.device("meta"):
        model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(spec)
    per_layer = parameter_count(dataclasses.replace(spec, layers=3)) - parameter_count(
        dataclasses.replace(spec, layers=2)
    )
    two = parameter_count(dataclasses.replace(spec, layers=2))
    assert parameter_count(spec) == two + (spec.layers - 2) * per_layer


def test_find_flavors_by_dims():
    assert find_flavors(layers=126, hidden=16384, heads=128) == ("llama3.1-405b",)
    assert "gpt3-175b" in find_flavors(layers=96, hidden=12288, heads=96)
    assert find_flavors(layers=3, hidden=7) == ()


def _csv_rows():
    with BASELINES_CSV.open(newline="") as f:
        return list(csv.DictReader(f))


def test_every_published_baseline_model_has_a_flavor():
    def dim(row, key):
        return int(row[key]) if row[key] else None

    missing = set()
    for row in _csv_rows():
        dims = {key: dim(row, col) for key, col in (
            ("layers", "layers"), ("hidden", "hidden"), ("heads", "heads"),
            ("ffn_hidden", "ffn"), ("kv_heads", "kv_heads"), ("vocab", "vocab"))}  # fmt: skip
        if not find_flavors(**dims):
            missing.add((row["model"], tuple(dims.values())))
    assert not missing


def test_alibi_flavors_are_mpt_and_bloom():
    alibi = {name for name, spec in FLAVORS.items() if spec.positions == "alibi"}
    assert alibi and all(name.startswith(("mpt-", "bloom-")) for name in alibi)


@pytest.mark.parametrize("name", [7, ["gpt3-125m"]])
def test_a_flavor_name_that_is_not_a_string_is_refused(name):
    with pytest.raises(SpecError, match=r"model\.name=.* must be a string naming a registered flavor"):
        get_flavor(name)
