"""The Python API as a newcomer scripts it for their own binary format: fixed 16-byte sensor
records read by a registered reader, trained, scored, sampled, written, compressed. What the
docstrings promise holds, and a wrong input is one BytemodelError line, never a TypeError from
the internals or a silent misreading."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import bytemodel
from bytemodel.errors import ConfigError, SourceError
from bytemodel.readers import Reader, register
from conftest import FAST


class SensorRecords(Reader):
    """b"SENS" + 16-byte records (uint32 time, three int16 readings, 6 pad bytes): one document."""
    name = "sens-test"
    extensions = (".senstest",)
    magic = (b"SENS",)
    description = "16-byte sensor records (test)"

    def read(self, path):
        data = Path(path).read_bytes()
        if not data.startswith(b"SENS") or (len(data) - 4) % 16:
            raise SourceError(f"{path}: not whole SENS records")
        yield data[4:]

    def write(self, data, path):
        data = bytes(data)
        Path(path).write_bytes(b"SENS" + data[:len(data) // 16 * 16])
        return Path(path)


register(SensorRecords, replace=True)


def _records(n: int) -> bytes:
    return b"".join(struct.pack("<Ihhh6x", 10 * i, int(100 * np.sin(i / 20)), i % 7 - 3, 7) for i in range(n))


def _settings(**kw):
    return {**FAST, "model": dict(FAST["model"]), **kw}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    (d / "log.senstest").write_bytes(b"SENS" + _records(400))
    result = bytemodel.train(d / "log.senstest", d / "R", steps=3, **_settings())
    return result.run_dir


@pytest.fixture(scope="module")
def lm(run):
    return bytemodel.load(run)


def test_the_run_records_the_custom_reader(lm, run):
    assert lm.reader == "sens-test"
    assert [len(d) for d in lm.read(Path(run).parent / "log.senstest")] == [400 * 16]


def test_a_uint8_array_is_bytes_everywhere(lm, tmp_path):
    """score, score_documents and compress took bytes, bytearray and memoryview but refused a uint8
    NumPy array, which generate's prompt and write took: one rule for every call now."""
    data = _records(20)
    arr = np.frombuffer(data, np.uint8)
    assert lm.score(arr) == lm.score(data)
    assert lm.score_documents([arr, bytearray(data)]) == lm.score_documents([data, data])
    assert lm.decompress(lm.compress(arr)) == data
    assert lm.generate(8, prompt=arr[:16], seed=1) == lm.generate(8, prompt=data[:16], seed=1)
    assert lm.write(arr, tmp_path / "a.senstest").read_bytes() == b"SENS" + data


def test_an_array_of_wider_numbers_is_refused_not_reinterpreted(lm):
    """bytes() of an int64 array is 8 bytes an element: a prompt [65, 66] would be 16 bytes."""
    for call in (lambda a: lm.score(a), lambda a: lm.generate(4, prompt=a), lambda a: lm.compress(a)):
        with pytest.raises(ConfigError, match="uint8, not of int64"):
            call(np.array([65, 66, 67]))


def test_a_prompt_that_is_not_bytes_is_refused(lm):
    """prompt=5 was bytes(5): a prompt of five zero bytes, silently."""
    with pytest.raises(ConfigError, match="generate's prompt takes bytes"):
        lm.generate(4, prompt=5)
    with pytest.raises(ConfigError, match="generate's prompt takes bytes"):
        lm.generate(4, prompt=[b"AC", b"GT"])


@pytest.mark.parametrize("n", [16.0, "16", True, None])
def test_a_byte_count_that_is_not_a_whole_number_is_one_error(lm, n):
    """16.0 was a TypeError about slice indices, "16" one about '<' between str and int."""
    with pytest.raises(ConfigError, match="bytes must be a whole number"):
        lm.generate(n)
    assert len(lm.generate(np.int64(3), seed=1)) == 3


def test_write_takes_a_str_and_refuses_a_list_of_samples(lm, tmp_path):
    """write("...") was TypeError "string argument without an encoding"; a list of samples
    (generate(samples=N)) one about bytes that cannot be read as an integer."""
    assert lm.write("0123456789abcdef", tmp_path / "s.senstest").read_bytes() == b"SENS0123456789abcdef"
    samples = lm.generate(16, seed=1, samples=2)
    with pytest.raises(ConfigError, match="write takes bytes .*not a list"):
        lm.write(samples, tmp_path / "t.senstest")
    assert not (tmp_path / "t.senstest").exists()


@pytest.mark.parametrize("one", [b"ACGT" * 8, "ACGT" * 8])
def test_score_documents_given_one_document_says_so(lm, one):
    """bytes iterated are ints: the error was "score_documents takes bytes ..., not a int"."""
    with pytest.raises(ConfigError, match="an iterable of documents .*score\\(\\) scores one"):
        lm.score_documents(one)


@pytest.mark.parametrize("setting, value, says", [
    ("steps", "3", "steps must be a whole number, got '3'"),
    ("steps", 2.5, "steps must be a whole number, got 2.5"),     # trained 3 steps, silently
    ("lr", "1e-3", "lr must be a number"),
    ("model", 5, "model must be a dict"),
    ("baseline", "no", "baseline must be true or false"),         # a non-empty str was true
    ("reader", 5, "reader must be a str"),
])
def test_a_training_setting_of_the_wrong_type_is_one_error(tmp_path, setting, value, says):
    """Before: TypeError "'<=' not supported between instances of 'str' and 'int'" from inside
    TrainConfig.validate, "'int' object is not a mapping", or a run that went on with the value."""
    (tmp_path / "log.senstest").write_bytes(b"SENS" + _records(100))
    with pytest.raises(ConfigError, match=says):
        bytemodel.train(tmp_path / "log.senstest", tmp_path / "R", **_settings(**{"steps": 2, setting: value}))
    if setting == "model":      # not a fine-tune's setting at all
        return
    with pytest.raises(ConfigError, match=says):
        bytemodel.finetune(tmp_path / "P", tmp_path / "log.senstest", tmp_path / "F", **{setting: value})
    assert not (tmp_path / "R").exists() and not (tmp_path / "F").exists()


def test_numpy_numbers_and_auto_dropout_are_taken(tmp_path):
    """A NumPy integer is a whole number (stored as a plain int: the checkpoint is JSON), and
    dropout="auto" is what the CLI's --dropout auto is (TrainConfig's -1)."""
    (tmp_path / "log.senstest").write_bytes(b"SENS" + _records(100))
    r = bytemodel.train(tmp_path / "log.senstest", tmp_path / "R",
                        **_settings(steps=np.int64(2), lr=np.float32(1e-3), dropout="auto"))
    assert r.step == 2
    assert bytemodel.load(r.run_dir).train_state["config"]["steps"] == 2


@pytest.mark.parametrize("source, says", [(b"SENS" + b"\0" * 64, "not a bytes: write the data to a file"),
                                          (["a.senstest"], "not a list")])
def test_a_source_that_is_not_a_path_is_one_error(tmp_path, monkeypatch, source, says):
    """Bytes were taken for a file name: OSError "File name too long" (or "source not found:
    b'SENS...'"); a list of files was "source not found: ['a.senstest']"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"source takes a path .*{says}"):
        bytemodel.train(source, "R", **_settings(steps=2))


def test_the_reader_may_be_given_as_a_registered_reader(tmp_path):
    """A Reader class or instance (as read_documents takes) failed as the run was saved: "Object of
    type type is not JSON serializable". The run records its spec; an unregistered one is refused."""
    (tmp_path / "log.bin").write_bytes(b"SENS" + _records(100))     # .bin: detection would say raw
    for i, reader in enumerate((SensorRecords, SensorRecords())):
        r = bytemodel.train(tmp_path / "log.bin", tmp_path / f"R{i}", reader=reader, **_settings(steps=2))
        assert bytemodel.load(r.run_dir).reader == "sens-test"

    class Unregistered(SensorRecords):
        name = "sens-unregistered"
    with pytest.raises(ConfigError, match="not registered as 'sens-unregistered'.*register\\(\\) it first"):
        bytemodel.train(tmp_path / "log.bin", tmp_path / "R9", reader=Unregistered, **_settings(steps=2))


def test_compress_codes_the_runs_readers_view_as_the_cli_does(tmp_path):
    """lm.compress coded a FASTA file's bytes as they are (headers and line breaks under a model
    that never saw one), where `bytemodel compress` codes its bases and packs the layout apart:
    on lambda phage under a 30-step tiny model, 5,819 bytes against 5,321."""
    pytest.importorskip("constriction")
    from bytemodel.compress.container import read
    rng = np.random.default_rng(0)
    seq = rng.choice(np.frombuffer(b"ACGT", np.uint8), 3000).tobytes()
    fasta = b">rec1 sensor\n" + b"\n".join(seq[i:i + 60] for i in range(0, len(seq), 60)) + b"\n"
    (tmp_path / "g.fa").write_bytes(fasta)
    lm = bytemodel.load(bytemodel.train(tmp_path / "g.fa", tmp_path / "R", **_settings(steps=2)).run_dir)
    assert lm.reader == "fasta"
    blob = lm.compress(fasta)
    assert read(blob)[0]["view"]["kind"] == "split"
    assert blob == lm.compress(fasta, reader="fasta")
    assert read(lm.compress(fasta, reader="raw"))[0]["view"]["kind"] == "as-is"
    assert lm.decompress(blob) == fasta


@pytest.mark.parametrize("chunk", [0, -1, 1.5, None])
@pytest.mark.parametrize("reader", ["raw", "sens-test"])
def test_stream_documents_refuses_a_chunk_size_that_is_not_positive(tmp_path, chunk, reader):
    """chunk_size=0 streamed a raw file as one empty piece and -1 as nothing at all (its data
    gone without a word); the base Reader.stream raised "range() arg 3 must not be zero"."""
    from bytemodel.readers import stream_documents
    (tmp_path / "log.senstest").write_bytes(b"SENS" + _records(10))
    with pytest.raises(ConfigError, match="chunk_size must be a positive number of bytes"):
        list(stream_documents(tmp_path / "log.senstest", reader, chunk_size=chunk))
    pieces = list(stream_documents(tmp_path / "log.senstest", reader, chunk_size=np.int64(64)))
    assert max(len(p) for p, _ in pieces) == 64 and pieces[-1][1]


def test_write_output_and_encode_take_the_same_bytes_as_the_model(tmp_path):
    """write_output("text") and Tokenizer().encode("text") were TypeError "string argument without
    an encoding"; write_output(5, ...) wrote five zero bytes and encode(5) gave five zero ids."""
    from bytemodel.readers import write_output
    assert write_output("héllo", tmp_path / "a.bin").read_bytes() == "héllo".encode()
    assert write_output(np.frombuffer(b"\x00\xff", np.uint8), tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert list(bytemodel.Tokenizer().encode("AB")) == [65, 66]
    for call in (lambda: write_output(5, tmp_path / "c.bin"), lambda: bytemodel.Tokenizer().encode(5)):
        with pytest.raises(ConfigError, match="takes bytes .*not a int"):
            call()
    assert not (tmp_path / "c.bin").exists()


def test_a_format_that_contradicts_the_name_names_the_argument_not_a_flag(lm, tmp_path):
    """From Python the error said "--format sens-test writes ...": a flag the API has no such name for."""
    from bytemodel.readers import write_output
    for call in (lambda: lm.write(b"x" * 16, tmp_path / "o.bin", fmt="sens-test"),
                 lambda: write_output(b"x" * 16, tmp_path / "o.bin", fmt="sens-test")):
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value) == ("fmt='sens-test' writes sens-test, but the name o.bin says raw: "
                                "give a name that matches, or another fmt")
    assert not (tmp_path / "o.bin").exists()


def test_what_decompress_raises_is_importable_beside_the_others(lm):
    """decompress raises CompressError, which bytemodel did not export beside ConfigError and the
    rest: `except bytemodel.CompressError` was an AttributeError."""
    with pytest.raises(bytemodel.CompressError, match="not a bytemodel compressed file"):
        lm.decompress(b"not a .bmz")
    assert "CompressError" in bytemodel.__all__


def test_a_reader_whose_options_a_spec_cannot_hold_says_so(tmp_path):
    """A FASTA header with a comma cannot be written as 'fasta:header=...' (the comma splits
    options): the run could not rebuild the reader it recorded."""
    from bytemodel.readers import get_reader
    (tmp_path / "g.fa").write_bytes(b">r\n" + b"ACGT" * 200 + b"\n")
    with pytest.raises(ConfigError, match="options do not survive as the spec the run records"):
        bytemodel.train(tmp_path / "g.fa", tmp_path / "R", reader=get_reader("fasta", header="unit 3, probe 1"),
                        **_settings(steps=2))
    r = bytemodel.train(tmp_path / "g.fa", tmp_path / "R2", reader=get_reader("fasta", case="upper"), **_settings(steps=2))
    assert bytemodel.load(r.run_dir).reader == "fasta:case=upper"


@pytest.mark.parametrize("kw, says", [({"temperature": "0.8"}, "temperature must be a number, got '0.8'"),
                                      ({"temperature": None}, "temperature must be a number, got None"),
                                      ({"top_k": 2.5}, "top-k must be a whole number, got 2.5"),
                                      ({"top_k": "3"}, "top-k must be a whole number"),
                                      ({"top_p": "0.9"}, "top-p must be a number")])
def test_sampling_settings_of_the_wrong_type_are_one_error(lm, kw, says):
    """Each was a TypeError from a comparison inside ('>=' not supported between 'str' and 'int')
    or from np.argpartition ("Partition index must be integer")."""
    with pytest.raises(ConfigError, match=says):
        lm.generate(8, seed=1, **kw)
    assert lm.generate(8, seed=1, temperature=np.float32(0.5), top_k=np.int64(3)) == \
        lm.generate(8, seed=1, temperature=0.5, top_k=3)
