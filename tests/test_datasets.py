"""The dataset catalogue and `get`: offline-first, checksums verified, clear errors."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from bytemodel import catalogue as datasets
from bytemodel.catalogue import DatasetError, get, load_catalogue, sha256_file, tree_sha256
from bytemodel.readers import get_reader, read_documents

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "datasets"
LAMBDA = DATA / "lambda_virus.fa"
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache."""
    c = tmp_path / "cache"
    monkeypatch.setenv("BYTEMODEL_CACHE", str(c))
    return c


def write_catalogue(tmp_path: Path, entries: list[dict]) -> dict:
    p = tmp_path / "catalogue.json"
    p.write_text(json.dumps({"version": 1, "datasets": entries}))
    return load_catalogue(p)


def entry(name: str, sources: list[dict]) -> dict:
    return {"name": name, "type": "dna", "reader": "fasta", "licence": "public domain",
            "description": "test", "size": "1 kB", "sources": sources}


# ---- the shipped catalogue ------------------------------------------------------------------------
def test_catalogue_is_complete_and_well_formed():
    cat = load_catalogue()
    types = {d.type for d in cat.values()}
    assert {"dna", "text", "audio", "image", "binary", "zstd"} <= types
    assert "lambda-phage" in cat and "klebsiella" in cat
    for d in cat.values():
        assert d.licence and d.description and d.sources, d.name
        get_reader(d.reader)  # a valid reader spec
        for s in d.sources:
            if s["kind"] in ("debian", "url", "shipped"):
                if "glob" in s:
                    assert HEX64.match(s["tree_sha256"]) and s["count"] > 0, d.name
                else:
                    assert all(HEX64.match(f["sha256"]) for f in s["files"]), d.name
            if s["kind"] == "debian":
                assert re.match(r"^[a-z0-9][a-z0-9.+-]+$", s["package"])


def test_only_public_domain_samples_are_shipped():
    shipped = sorted(p.name for p in DATA.iterdir() if not p.name.startswith("__"))
    assert shipped == ["catalogue.json", "klebsiella_hs11286_1m.fa.gz", "lambda_virus.fa", "make_catalogue.py"]
    cat = load_catalogue()
    for name in shipped[1:3]:  # every shipped file is catalogued, checksummed, public domain
        entry = next(d for d in cat.values() for s in d.sources
                     if s["kind"] == "shipped" and s["files"][0]["path"] == name)
        assert "public domain" in entry.licence
        assert next(s for s in entry.sources if s["kind"] == "shipped")["files"][0]["sha256"] == \
            sha256_file(DATA / name)
    lam = cat["lambda-phage"]
    src = next(s for s in lam.sources if s["kind"] == "shipped")
    assert src["files"][0]["sha256"] == sha256_file(LAMBDA)
    assert "public domain" in lam.licence


# ---- get ------------------------------------------------------------------------------------------
def test_get_shipped_sample_then_from_cache(cache):
    d = get("lambda-phage")
    assert d == cache / "datasets" / "lambda-phage"
    assert (d / "lambda_virus.fa").read_bytes() == LAMBDA.read_bytes()
    (d / "lambda_virus.fa").write_bytes(b"x")  # damaged: size no longer matches the marker
    assert not datasets.is_cached(d)
    assert (get("lambda-phage") / "lambda_virus.fa").read_bytes() == LAMBDA.read_bytes()
    assert list(read_documents(d)) == list(read_documents(LAMBDA))  # the marker file is skipped


def test_get_into_dest(tmp_path):
    d = get("lambda-phage", dest=tmp_path / "here")
    assert d == tmp_path / "here" and (d / "lambda_virus.fa").is_file()


def test_derived_zstd_dataset_decompresses_to_the_genome():
    zstandard = pytest.importorskip("zstandard")
    d = get("lambda-phage-zst")
    blob = (d / "lambda_virus.fa.zst").read_bytes()
    assert zstandard.ZstdDecompressor().stream_reader(blob).read() == LAMBDA.read_bytes()
    assert list(read_documents(d)) == list(read_documents(LAMBDA))  # .fa.zst -> fasta
    assert list(read_documents(d, "zstd")) == [LAMBDA.read_bytes()]


def test_missing_package_names_the_package(tmp_path):
    cat = write_catalogue(tmp_path, [entry("ghost", [
        {"kind": "debian", "package": "no-such-pkg", "files": [{"path": "/nonexistent/x.fa", "sha256": "0" * 64}]}])])
    with pytest.raises(DatasetError) as e:
        get("ghost", catalogue=cat)
    msg = str(e.value)
    assert "apt-get install no-such-pkg" in msg and "\n" not in msg


def test_unknown_dataset():
    with pytest.raises(DatasetError, match="unknown dataset 'nope'.*lambda-phage"):
        get("nope")


def test_checksum_mismatch_is_refused(tmp_path):
    f = tmp_path / "file.fa"
    f.write_bytes(b">x\nACGT\n")
    cat = write_catalogue(tmp_path, [entry("bad", [
        {"kind": "debian", "package": "pkg", "files": [{"path": str(f), "sha256": "ab" * 32}]}])])
    with pytest.raises(DatasetError, match="differs from the catalogue"):
        get("bad", catalogue=cat)
    assert not (datasets.cache_root() / "datasets" / "bad" / "file.fa").exists()


def test_url_only_when_asked_and_checksum_verified(tmp_path):
    f = tmp_path / "remote.fa"
    f.write_bytes(b">r\nACGTACGT\n")
    good = hashlib.sha256(f.read_bytes()).hexdigest()
    src = {"kind": "url", "files": [{"url": f.as_uri(), "name": "r.fa", "sha256": good}]}
    cat = write_catalogue(tmp_path, [entry("remote", [src]),
                                     entry("tampered", [{**src, "files": [{**src["files"][0], "sha256": "cd" * 32}]}]),
                                     entry("gone", [{**src, "files": [{**src["files"][0], "url": (tmp_path / "x").as_uri()}]}])])
    with pytest.raises(DatasetError, match="download=True"):
        get("remote", catalogue=cat)
    d = get("remote", download=True, catalogue=cat)
    assert (d / "r.fa").read_bytes() == f.read_bytes()
    with pytest.raises(DatasetError, match="refused"):
        get("tampered", download=True, catalogue=cat)
    with pytest.raises(DatasetError, match="download of .* failed"):
        get("gone", download=True, catalogue=cat)


def test_glob_source_with_tree_checksum(tmp_path):
    base = tmp_path / "pkg"
    (base / "a").mkdir(parents=True)
    (base / "a" / "1.wav").write_bytes(b"one")
    (base / "2.wav").write_bytes(b"two")
    (base / "link.wav").symlink_to(base / "2.wav")  # aliases are skipped
    sums = {"a/1.wav": hashlib.sha256(b"one").hexdigest()}
    src = {"kind": "debian", "package": "p", "base": str(base), "glob": "*/*.wav", "count": 1,
           "tree_sha256": tree_sha256(sums)}
    cat = write_catalogue(tmp_path, [entry("g", [src]), entry("h", [{**src, "count": 2}])])
    d = get("g", catalogue=cat)
    assert (d / "a" / "1.wav").read_bytes() == b"one"
    with pytest.raises(DatasetError, match="1 found, 2 expected"):
        get("h", catalogue=cat)


def test_glob_source_accepts_another_listed_version_and_no_other(tmp_path):
    """`also`: a tree of another package version is accepted whole; a tree listed nowhere, or a
    listed count with other contents, is refused."""
    base = tmp_path / "pkg"
    base.mkdir()
    (base / "1.rst").write_bytes(b"new one")
    (base / "2.rst").write_bytes(b"two")
    old = {"1.rst": hashlib.sha256(b"old one").hexdigest()}
    new = {"1.rst": hashlib.sha256(b"new one").hexdigest(), "2.rst": hashlib.sha256(b"two").hexdigest()}
    src = {"kind": "debian", "package": "p", "base": str(base), "glob": "*.rst", "count": 1,
           "tree_sha256": tree_sha256(old), "also": [{"version": "2", "count": 2, "tree_sha256": tree_sha256(new)}]}
    cat = write_catalogue(tmp_path, [entry("g", [src]), entry("h", [{**src, "also": []}]),
                                     entry("k", [{**src, "also": [{**src["also"][0], "tree_sha256": tree_sha256(old)}]}])])
    assert (get("g", catalogue=cat) / "2.rst").read_bytes() == b"two"
    with pytest.raises(DatasetError, match="2 found, 1 expected"):
        get("h", catalogue=cat)
    with pytest.raises(DatasetError, match="2 found, 1 or 2 expected"):
        get("k", catalogue=cat)


def test_later_source_is_tried_when_the_first_is_missing(tmp_path):
    f = tmp_path / "b.fa"
    f.write_bytes(b">b\nAC\n")
    cat = write_catalogue(tmp_path, [entry("two", [
        {"kind": "debian", "package": "absent-pkg", "files": [{"path": "/nonexistent/a.fa", "sha256": "0" * 64}]},
        {"kind": "local", "files": [{"path": str(f)}]}])])
    assert (get("two", catalogue=cat) / "b.fa").read_bytes() == f.read_bytes()


# ---- the catalogue's checksums match the installed Debian packages --------------------------------
@pytest.mark.parametrize("name", ["lambda-phage", "klebsiella", "alsa-sounds", "tango-icons",
                                  "freedesktop-sounds", "fortunes"])
def test_catalogue_matches_installed_package(name):
    ds = load_catalogue()[name]
    src = next(s for s in ds.sources if s["kind"] == "debian")
    present = (datasets.glob_files(src["base"], src["glob"]) if "glob" in src
               else all(Path(f["path"]).is_file() for f in src["files"]))
    if not present:
        pytest.skip(f"needs Debian package {src['package']}; see .ci/apt-packages.txt")
    cat = {name: datasets.Dataset(**{**ds.__dict__, "sources": [src]})}  # only the Debian source
    d = get(name, catalogue=cat)
    docs = list(read_documents(d, ds.reader))
    assert docs and all(isinstance(x, bytes) for x in docs)
    if name == "klebsiella":
        assert len(docs) == 16 and sum(map(len, docs)) > 22_000_000  # 7 + 1 + 6 + 2 records


def test_local_elf():
    if not Path("/usr/bin/ls").is_file():
        pytest.skip("no /usr/bin/ls on this machine")
    d = get("elf-ls")
    assert (d / "ls").read_bytes()[:4] == b"\x7fELF"


def test_linux_docs_from_the_installed_package(tmp_path):
    """`bytemodel data get linux-docs` offline from Debian's linux-doc-6.1: every .rst.gz file,
    checksummed as a tree, read as UTF-8 text (24.2 MB of it)."""
    from typer.testing import CliRunner
    from bytemodel.cli import app
    ds = load_catalogue()["linux-docs"]
    src = ds.sources[0]
    if not datasets.glob_files(src["base"], src["glob"]):
        pytest.skip("needs Debian package linux-doc-6.1")
    r = CliRunner().invoke(app, ["data", "get", "linux-docs"])
    assert r.exit_code == 0, r.output
    d = Path(r.output.strip().splitlines()[-1])
    files = sorted(d.rglob("*.rst.gz"))
    known = {src["count"]} | {t["count"] for t in src.get("also", [])}
    assert len(files) in known == {3183, 3184} and (d / "admin-guide" / "README.rst.gz").is_file()
    n = sum(len(x) for x in read_documents(d, ds.reader))
    assert 24_000_000 < n < 24_500_000, n


# ================================================================================================
# a cached file is verified again (fault injection)
# ================================================================================================
def test_data_get_reverifies_a_cached_file_of_the_right_size(tmp_path, monkeypatch):
    from bytemodel import catalogue
    monkeypatch.setenv("BYTEMODEL_CACHE", str(tmp_path / "cache"))
    first = catalogue.get("lambda-phage")
    (f,) = [p for p in first.iterdir() if not p.name.startswith(".")]
    good = f.read_bytes()
    bad = bytearray(good)
    bad[100] ^= 0x01
    f.write_bytes(bytes(bad))          # same size, one bit off
    again = catalogue.get("lambda-phage")
    assert again == first
    assert f.read_bytes() == good       # fetched afresh from the verified source



def test_get_into_a_folder_never_replaces_a_file_of_the_users(tmp_path):
    """`data get lambda-phage -d mydir` where mydir holds the user's own lambda_virus.fa replaced it
    without a word; now refused, nothing written; a damaged earlier copy (listed in the marker) is
    still fetched afresh."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "lambda_virus.fa").write_bytes(b">my own assembly\nACGT\n")
    with pytest.raises(DatasetError, match="lambda_virus.fa exists and is not an earlier copy"):
        get("lambda-phage", dest=mine)
    assert (mine / "lambda_virus.fa").read_bytes() == b">my own assembly\nACGT\n"
    assert not (mine / datasets.MARKER).exists()
    d = get("lambda-phage", dest=tmp_path / "here")
    (d / "lambda_virus.fa").write_bytes(b"damaged")
    assert (get("lambda-phage", dest=d) / "lambda_virus.fa").read_bytes() == LAMBDA.read_bytes()
