"""Each setting is declared once (its group's field) and everything else reads it there;
every extension point is built by the same call from the same read-only settings."""

from __future__ import annotations

import dataclasses

import pytest

from sparkdl.config import GROUPS, TrainConfig, setting_docs, setting_fields
from sparkdl.contract.plan import FitPlan
from sparkdl.errors import ConfigError
from sparkdl.ml.params import SETTING_PARAMS, TrainingParams
from sparkdl.sync.codecs import CODECS, Compression, TopK
from sparkdl.sync.merges import MERGES
from sparkdl.sync.modes import MODES
from sparkdl.sync.outer import OuterOptimizer
from sparkdl.sync.settings import FitSettings


def test_every_setting_is_one_field_of_one_group_and_a_keyword_of_train_config() -> None:
    declared = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(declared) == len(set(declared))
    assert [f.name for f in setting_fields()] == declared
    for group in GROUPS.values():
        for f in dataclasses.fields(group):
            assert len(f.metadata["doc"]) > 10, f.name
            (flat,) = [s for s in setting_fields() if s.name == f.name]
            assert (flat.type, flat.default, flat.metadata) == (f.type, f.default, f.metadata)


def test_the_docstring_the_params_and_the_help_read_the_declarations() -> None:
    docs = setting_docs()
    args = (TrainConfig.__doc__ or "").split("Args:", 1)[1].split("Raises:", 1)[0]
    assert " ".join(args.split()).count(": ") >= len(docs)
    for name, doc in docs.items():
        assert f"        {name}: " in args, name
        param = getattr(TrainingParams, SETTING_PARAMS[name])
        assert param.doc == f"{name}: {doc}"
    assert SETTING_PARAMS["batch_size"] == "batchSize"


def test_the_plan_copies_the_settings_it_takes_as_given() -> None:
    given = [f.name for f in dataclasses.fields(FitPlan) if f.metadata.get("as_given")]
    assert {"epochs", "batch_size", "port", "data_cache"} <= set(given)
    settings = {f.name for f in setting_fields()}
    assert set(given) <= settings
    config = TrainConfig(epochs=3, batch_size=7, seed=5, port=4000, data_cache="disk")
    plan = FitPlan.resolve(config, num_workers=2, rows=40, threads=1, service_host="h")
    assert all(getattr(plan, name) == getattr(config, name) for name in given)


def test_every_extension_point_is_built_by_one_call_from_the_same_settings() -> None:
    values = TrainConfig(compression="topk", outer_optimizer="sgd").to_dict()
    settings = FitSettings(values, num_workers=4, synchronous=True)
    for registry in (MODES, MERGES, CODECS):
        for name, cls in registry.items():
            assert cls.resolve(settings).name == name
    assert OuterOptimizer.resolve(settings).kind == "sgd"
    # A codec says what answers need: top-k keeps every worker's pushes' worth.
    assert Compression.resolve(settings) == Compression(TopK(0.01), TopK(0.04))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.num_workers = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.values["epochs"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError, match="No setting 'nothing'"):
        _ = settings.nothing


def test_a_merge_says_whether_an_outer_optimizer_steps_on_it() -> None:
    supported = tuple(n for n, c in MERGES.items() if c.supports_outer_optimizer)
    assert supported == ("average", "delta")
    with pytest.raises(ConfigError, match=r"one of \('average', 'delta'\); merge='elastic'"):
        TrainConfig(merge="elastic", outer_optimizer="nesterov")
