"""The config reference (docs/config.md) is generated from the schema and must not drift from it."""

from __future__ import annotations

from eagle3.config import doc as configdoc
from eagle3.config import PipelineConfig, Server
from eagle3.phases.bench_settings import Bench


def test_readme_config_reference_is_the_generated_text():
    text = configdoc.REFERENCE.read_text()
    assert configdoc.region(text) == configdoc.render(), \
        "docs/config.md's config reference is out of date: run `python -m eagle3.config.doc` and commit it"


def test_every_field_of_every_section_is_described_and_listed():
    doc = configdoc.render()
    names = [name for name, _ in configdoc.sections()]
    assert names[:3] == ["top level", "target", "engines"] and {"*.server", "engines.*", "datagen.sampling"} <= set(names)
    assert len(names) == len(set(names)), "a shared section is documented once"
    for name, model in configdoc.sections():
        for field, info in model.model_fields.items():
            assert info.description, f"{name}.{field} has no Field(description=...)"
            assert f"| `{field}` |" in doc
    row = next(line for line in doc.splitlines() if line.startswith("| `acceptance_floor` |"))
    assert row == f"| `acceptance_floor` | number ≥ 1.0 | `1.3` | {Bench.model_fields['acceptance_floor'].description} |"
    assert "| `port` | integer ≥ 1, ≤ 65535 | required |" in doc and Server.model_fields["port"].is_required()
    assert "| `handoff` | section | (its defaults) |" in doc and "handoff" in PipelineConfig.model_fields


def test_check_fails_on_drift_and_the_rewrite_touches_only_the_region(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    good = configdoc.REFERENCE.read_text()
    readme.write_text(good.replace("| `acceptance_floor` | number ≥ 1.0 | `1.3` |", "| `acceptance_floor` | number | `1.5` |"))
    monkeypatch.setattr(configdoc, "REFERENCE", readme)
    assert configdoc.main(["--check"]) == 1
    assert configdoc.main([]) == 0 and readme.read_text() == good
    assert configdoc.main(["--check"]) == 0
