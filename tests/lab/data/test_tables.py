"""The CSV/TSV/JSONL table reader and label handling; fuzzed: any bytes give a table or a TableError."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nystrom_lab.data.tables import (
    LabelSpec,
    TableError,
    encode_labels,
    infer_labels,
    read_table,
    table_examples,
)

# examples per test: the conftest profile (HYPOTHESIS_PROFILE=ci, the default, or long)
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_csv_with_quotes_commas_newlines_bom_and_blank_lines(tmp_path):
    path = _write(tmp_path, "t.csv", '\ufefftext,label\n"a, b",pos\n\n"two\nlines ""quoted""",neg\n')
    t = read_table(path)
    assert t.columns == ("text", "label") and t.lines == [2, 4]
    assert t.texts("text") == ["a, b", 'two\nlines "quoted"']


def test_tsv_treats_quotes_as_text_and_jsonl_reads_objects(tmp_path):
    t = read_table(_write(tmp_path, "t.tsv", 'sentence\tlabel\na "quoted\t1\n'))
    assert t.texts("sentence") == ['a "quoted']
    j = read_table(
        _write(tmp_path, "t.jsonl", '{"text": "x", "label": ["a", "b"]}\n\n{"text": "y", "label": []}\n')
    )
    assert j.lines == [1, 3] and j.values("label") == [["a", "b"], []]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "m.csv",
            "text,label\na,1\nb\n",
            r"m\.csv line 3: expected 2 comma-separated fields \(text, label\), got 1",
        ),
        ("m.tsv", "text\tlabel\na\t1\tx\n", r"m\.tsv line 2: expected 2 tab-separated fields"),
        ("m.csv", 'text,label\n"open,1\n', r"m\.csv line \d+: malformed CSV"),
        (
            "m.jsonl",
            '{"text": "a"}\n{"text": \n',
            r"m\.jsonl line 2: not valid JSON \(Expecting value at character 10\)",
        ),
        ("m.jsonl", '["a", 1]\n', r"m\.jsonl line 1: expected a JSON object per line, got list"),
        (
            "m.csv",
            b"text,label\nok,1\n\xff\xfe,0\n",
            r"m\.csv line 3: not UTF-8 text \(.* at byte 1 of the line\)",
        ),
        ("m.csv", "", r"m\.csv line 1: the file is empty"),
        ("m.csv", "text,text\na,b\n", r"names column\(s\) \['text'\] more than once"),
        ("m.txt", "text\n", r"cannot tell the format from the suffix '\.txt'"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, name, content, message):
    with pytest.raises(TableError, match=message):
        read_table(_write(tmp_path, name, content))


def test_missing_column_lists_the_columns_there_are(tmp_path):
    t = read_table(_write(tmp_path, "t.csv", "sentence,label\na,1\n"))
    with pytest.raises(
        TableError, match=r"t\.csv: no column 'text'; the columns are \['sentence', 'label'\]"
    ):
        t.texts("text")
    j = read_table(_write(tmp_path, "t.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n'))
    with pytest.raises(TableError, match=r"t\.jsonl line 2: column 'label': missing"):
        infer_labels(j, "label")
    bad = read_table(_write(tmp_path, "b.jsonl", '{"text": 3, "label": 1}\n'))
    with pytest.raises(TableError, match=r"b\.jsonl line 1: column 'text': expected text, got 3 \(int\)"):
        bad.texts("text")


def test_string_labels_become_sorted_names_and_integers_stay_numbers(tmp_path):
    t = read_table(_write(tmp_path, "t.csv", "text,label\na,pos\nb,neg\nc,pos\n"))
    spec = infer_labels(t, "label")
    assert spec == LabelSpec("single_label_classification", ("neg", "pos"))
    assert encode_labels(t, "label", spec) == [1, 0, 1]
    n = read_table(_write(tmp_path, "n.jsonl", "".join(json.dumps({"label": v}) + "\n" for v in (10, 2, 2))))
    assert infer_labels(n, "label").names == ("2", "10")  # numeric order, not "10" < "2"


def test_regression_and_multi_label(tmp_path):
    r = read_table(_write(tmp_path, "r.csv", "text,score\na,0.5\nb,3\nc,-1e-2\n"))
    spec = infer_labels(r, "score")
    assert spec.problem_type == "regression" and spec.num_labels == 1
    assert encode_labels(r, "score", spec) == [0.5, 3.0, -0.01]
    m = read_table(_write(tmp_path, "m.csv", 'text,tags\na,"x, y"\nb,\nc,z\n'))
    spec = infer_labels(m, "tags", "multi_label_classification")
    assert spec.names == ("x", "y", "z")
    assert encode_labels(m, "tags", spec) == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    with pytest.raises(TableError, match=r"r\.csv line 3: column 'score': expected a number"):
        encode_labels(
            read_table(_write(tmp_path, "r.csv", "text,score\na,1\nb,x\n")), "score", LabelSpec("regression")
        )


def test_dev_labels_unknown_to_training_are_errors(tmp_path):
    dev = read_table(_write(tmp_path, "dev.csv", "text,label\na,pos\nb,maybe\n"))
    with pytest.raises(
        TableError, match=r"dev\.csv line 3: column 'label': label 'maybe' is not among the training labels"
    ):
        table_examples(
            dev,
            text_column="text",
            label_column="label",
            labels=LabelSpec("single_label_classification", ("neg", "pos")),
        )


def test_empty_tables_and_empty_examples_are_refused(tmp_path):
    with pytest.raises(TableError, match=r"e\.csv: no examples after the header"):
        read_table(_write(tmp_path, "e.csv", "text,label\n\n"))
    t = read_table(_write(tmp_path, "t.csv", "text,label\nfine,a\n  ,b\n"))
    with pytest.raises(
        TableError, match=r"t\.csv line 3: empty example: no text in column\(s\) \['text'\]"
    ) as info:
        table_examples(t, text_column="text")
    assert (info.value.line, info.value.path.name) == (3, "t.csv")  # a DataFileError like every reader's


def test_a_single_class_is_refused(tmp_path):
    with pytest.raises(TableError, match="holds one label only"):
        infer_labels(read_table(_write(tmp_path, "t.csv", "text,label\na,x\nb,x\n")), "label")


def _use(path):
    """Everything fine-tuning does with a table: read it, take columns, infer and encode labels."""
    t = read_table(path)
    for col in ("text", "label"):
        if col in t.columns:
            t.values(col)
    if "text" in t.columns:
        t.texts("text")
    if "label" in t.columns:
        spec = infer_labels(t, "label")
        encode_labels(t, "label", spec)


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".csv", ".tsv", ".jsonl"]))
def test_fuzz_random_bytes_give_a_table_or_a_table_error(tmp_path, data, suffix):
    path = tmp_path / f"f{suffix}"
    path.write_bytes(data)
    try:
        _use(path)
    except TableError as err:
        assert str(err).startswith(str(path))


SEEDS = {
    ".csv": b'text,label\n"a, b",pos\nplain,neg\n"multi\nline",pos\n',
    ".tsv": b"text\tlabel\na\t1\nb\t0\n",
    ".jsonl": b'{"text": "a", "label": "pos"}\n{"text": "b", "label": ["x", 2]}\n{"text": "c", "label": 0.5}\n',
}


@FUZZ
@given(
    suffix=st.sampled_from(sorted(SEEDS)),
    edits=st.lists(
        st.tuples(st.integers(0, 200), st.integers(0, 3), st.binary(min_size=0, max_size=4)), max_size=6
    ),
)
def test_fuzz_mutated_valid_files_give_a_table_or_a_table_error(tmp_path, suffix, edits):
    data = bytearray(SEEDS[suffix])
    for pos, cut, insert in edits:
        pos = pos % (len(data) + 1)
        data[pos : pos + cut] = insert
    path = tmp_path / f"m{suffix}"
    path.write_bytes(bytes(data))
    try:
        _use(path)
    except TableError as err:
        assert str(err).startswith(str(path))
