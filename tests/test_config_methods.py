"""JobConfig's training methods: their options, bounds and the checks between them (config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tunestudio import paths
from tunestudio.config import METHOD_OPTIONS, JobConfig, format_validation_error


def config(**fields: Any) -> JobConfig:
    return JobConfig.model_validate({"model_name": "m", "hf_dataset": "d", **fields})


def errors(**fields: Any) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as info:
        config(**fields)
    return format_validation_error(info.value)


GRPO = {"method": "grpo", "reward_functions": ["exact_match"], "batch_size": 4, "gradient_accumulation_steps": 1}


def test_sft_is_the_default_and_every_method_validates_and_round_trips() -> None:
    assert config().method == "sft"
    for fields in ({"method": "dpo"}, {"method": "orpo"}, {"method": "kto"}, GRPO, {"method": "pretrain"}):
        cfg = config(**fields)
        assert JobConfig.from_parts(cfg.public_dict()) == cfg  # the worker validates the stored dict again


def test_pretrain_packs_by_default_and_can_be_told_not_to() -> None:
    assert config(method="pretrain").packing is True
    assert config(method="Continued-Pretraining").method == "pretrain"
    assert config(method="pretrain", packing=False).packing is False
    assert config(method="sft").packing is False


# One value per option that differs from its default and is valid for its own method.
OTHER_VALUES = {
    "beta": 0.5, "dpo_loss_type": "ipo", "desirable_weight": 2.0, "undesirable_weight": 2.0, "num_generations": 2,
    "max_completion_length": 64, "generation_temperature": 0.7, "kl_beta": 0.01, "reward_functions": ["exact_match"],
    "reward_weights": [1.0], "reward_format_pattern": "x", "packing": True, "train_on_completions": True,
    "padding_free": True,
}


@pytest.mark.parametrize("option", list(METHOD_OPTIONS))
def test_an_option_of_another_method_is_an_error_naming_both(option: str) -> None:
    method = next(m for m in ("sft", "dpo", "orpo", "kto", "grpo", "pretrain") if m not in METHOD_OPTIONS[option])
    fields = {**(GRPO if method == "grpo" else {"method": method}), option: OTHER_VALUES[option]}
    found = errors(**fields)
    assert found[0]["field"] == option
    assert f"not to method '{method}'" in found[0]["message"]
    assert all(m in found[0]["message"] for m in METHOD_OPTIONS[option])


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"method": "dpo", "beta": 0}, "beta", "greater than 0"),
    ({"method": "grpo", "num_generations": 1}, "num_generations", "greater than or equal to 2"),
    ({"method": "nope"}, "method", "'sft', 'dpo', 'orpo', 'kto', 'grpo', 'pretrain' or 'reward'"),
    ({**GRPO, "reward_functions": []}, "reward_functions", "needs at least one reward function"),
    ({**GRPO, "reward_functions": ["exactly"]}, "reward_functions", "neither a built-in"),
    ({**GRPO, "reward_functions": ["a.py:score", "b.py:score"]}, "reward_functions", "score named twice"),
    ({**GRPO, "reward_weights": [1.0, 2.0]}, "reward_weights", "2 weights for 1 reward functions"),
    ({**GRPO, "reward_functions": ["format_regex"]}, "reward_format_pattern", "needs a pattern"),
    ({**GRPO, "reward_functions": ["format_regex"], "reward_format_pattern": "(unclosed"}, "reward_format_pattern",
     "not a regular expression"),
    ({**GRPO, "batch_size": 3}, "num_generations", "(3) must be a multiple of num_generations (4)"),
    ({"method": "kto", "batch_size": 1}, "batch_size", "at least 2"),
    ({"method": "dpo", "format_type": "alpaca"}, "format_type", "not a format of method 'dpo'; use auto or preference"),
    ({"method": "pretrain", "format_type": "messages"}, "format_type", "use auto or text"),
    ({"method": "dpo", "custom_format_mapping": {"q": "prompt", "a": "chosen"}}, "custom_format_mapping",
     "nothing maps to rejected"),
    ({"method": "sft", "custom_format_mapping": {"q": "user", "a": "chosen"}}, "custom_format_mapping",
     "not to chosen"),
    ({"method": "kto", "custom_format_mapping": {"q": "prompt", "a": "completion", "b": "text"}},
     "custom_format_mapping", "text is not one of them"),
])
def test_bad_method_settings_name_their_field(fields: dict[str, Any], field: str, says: str) -> None:
    found = errors(**fields)
    assert found[0]["field"] == field, found
    assert says in found[0]["message"], found


def test_user_reward_functions_are_only_spelled_here_never_loaded() -> None:
    # The file does not exist: the config cannot know (it does no I/O); the worker names it when it loads it.
    cfg = config(**{**GRPO, "reward_functions": ["exact_match", "no/such/file.py:score"]})
    assert cfg.reward_functions == ["exact_match", "no/such/file.py:score"]


def test_a_reward_function_file_is_made_absolute_at_submit_and_must_exist(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.py").write_text("def score(completions, **kw):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    cfg = config(**{**GRPO, "reward_functions": ["exact_match", "mine.py:score"]})
    assert paths.resolve(cfg).reward_functions == ["exact_match", f"{tmp_path / 'mine.py'}:score"]
    with pytest.raises(paths.PathRefused) as info:
        paths.resolve(config(**{**GRPO, "reward_functions": ["other.py:score"]}))
    assert info.value.field == "reward_functions" and "'other.py' does not exist" in info.value.message


_SPELLINGS = {None: "sft", "sft": "sft", "dpo": "dpo", "orpo": "orpo", "kto": "kto", "grpo": "grpo",
              "pretrain": "pretrain", "Continued pretraining": "pretrain", "reward": "reward"}  # None: sft
_FIELD_VALUES = {
    "beta": st.floats(0.001, 100),
    "packing": st.sampled_from([None, True, False]),
    "batch_size": st.sampled_from([1, 2, 4, 8]),
    "num_generations": st.sampled_from([2, 4, 8]),
    "reward_functions": st.sampled_from([["exact_match"], ["exact_match", "r.py:score"], []]),
    "reward_weights": st.sampled_from([None, [], [0.5], [1.0, -0.5]]),
    "format_type": st.sampled_from(["auto", "preference", "unpaired", "prompt_only", "text", "pairs"]),
    "custom_format_mapping": st.sampled_from([None, {"q": "prompt", "a": "chosen", "b": "rejected"},
                                              {"q": "user", "a": "assistant"}, {"t": "text"}]),
}


def _fields_of(spelling: str | None) -> st.SearchStrategy[dict[str, Any]]:
    """A method, any of the fields every method takes or this one does, and any other method's option at its
    default (what a form sends; another value is refused before anything else:
    test_an_option_of_another_method_is_an_error_naming_both; drawing those made 94 % of the examples invalid,
    about 5,000 a run)."""
    method = _SPELLINGS[spelling]
    fields = {name: values for name, values in _FIELD_VALUES.items() if method in METHOD_OPTIONS.get(name, (method,))}
    fields |= {name: st.just(JobConfig.model_fields[name].get_default(call_default_factory=True))
               for name, methods in METHOD_OPTIONS.items() if method not in methods}
    return st.fixed_dictionaries({} if spelling is None else {"method": st.just(spelling)}, optional=fields)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(_SPELLINGS)).flatmap(_fields_of))
def test_validating_a_method_configs_own_dump_gives_it_back(fields: dict[str, Any]) -> None:
    try:
        cfg = config(**fields)
    except ValidationError:
        assume(False)
    assert JobConfig.model_validate(cfg.public_dict()) == cfg
