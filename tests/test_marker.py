"""The DONE marker as a typed record (eagle3.marker): what a phase writes, what every reader gets back,
and the fingerprint markers written before the type existed still carry."""

from __future__ import annotations

import hashlib
import json

from eagle3.marker import DoneMarker

FIELDS = {"phase": "train", "config": "c0ffee", "upstream": "abc123", "code": "0.1.0+deadbeef", "started_at": 1.5,
          "finished_at": 9.25, "summary": {"output": "/r/train", "headline": "3 epochs", "details": {"n": 3}},
          "force_token": None}


def test_sealed_fingerprints_what_it_records_as_the_dict_markers_did():
    marker = DoneMarker.sealed(**FIELDS)
    legacy = hashlib.sha256(json.dumps(FIELDS, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert marker.fingerprint == legacy, "markers already on disk keep their fingerprints"
    assert DoneMarker.sealed(**(FIELDS | {"finished_at": 9.5})).fingerprint != legacy, "a redo gets a new one"
    assert DoneMarker.from_dict(json.loads(json.dumps(marker.to_dict()))) == marker
    assert marker.headline == "3 epochs"


def test_anything_that_is_not_a_marker_reads_as_none():
    for data in (None, [], "done", {"phase": "train"}, {"fingerprint": "x", "summary": {}}, {"summary": {}}):
        assert DoneMarker.from_dict(data) is None, data
    extra = DoneMarker.sealed(**FIELDS).to_dict() | {"written_by": "a newer pack"}
    assert DoneMarker.from_dict(extra).fingerprint == DoneMarker.sealed(**FIELDS).fingerprint
