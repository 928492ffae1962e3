import json
import os

import pytest

from rag_lab.core.records import RecordWriter, atomic_write_json, atomic_write_text, read_records


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "metrics.json"
    atomic_write_json(path, {"em": 0.5})
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in path.parent.iterdir()] == ["metrics.json"]
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)


def test_atomic_write_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "metrics.json"
    atomic_write_json(path, {"em": 0.5})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"em": object()})
    assert json.loads(path.read_text()) == {"em": 0.5}
    assert len(os.listdir(tmp_path)) == 1


def test_writer_appends_batches(tmp_path):
    w = RecordWriter(tmp_path / "records.jsonl")
    w.write([{"id": "a"}, {"id": "b"}])
    w.write([])
    w.write([{"id": "c"}])
    assert [r["id"] for r in read_records(w.path)] == ["a", "b", "c"]


def test_torn_last_line_is_dropped_and_truncated(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "pred')
    assert [r["id"] for r in read_records(path)] == ["a", "b"]
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'
    RecordWriter(path).write([{"id": "c"}])
    assert [r["id"] for r in read_records(path)] == ["a", "b", "c"]


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"id": "a"}\nnot json\n{"id": "c"}\n')
    with pytest.raises(ValueError, match=r"records.jsonl:2: malformed record"):
        read_records(path)


def test_missing_file_reads_empty(tmp_path):
    assert read_records(tmp_path / "none.jsonl") == []
