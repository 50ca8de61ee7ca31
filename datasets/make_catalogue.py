"""Maintainer helper: (re)build datasets/catalogue.json with checksums of the files installed here.

Run from the repository root on Debian 12 with every package named below installed:
    PYTHONPATH=. python datasets/make_catalogue.py
"""
import json
from pathlib import Path
from bytemodel.atomic import write_atomic
from bytemodel.catalogue import sha256_file, glob_files, tree_sha256

def files(pkg, paths, names=None):
    return {"kind": "debian", "package": pkg,
            "files": [{"path": p, "sha256": sha256_file(p)} for p in paths]}

def globsrc(pkg, base, pattern):
    fs = glob_files(base, pattern)
    return {"kind": "debian", "package": pkg, "base": base, "glob": pattern, "count": len(fs),
            "tree_sha256": tree_sha256({r: sha256_file(p) for r, p in fs.items()})}

# linux-doc-6.1's Documentation trees known to us, by package version (the catalogue's first is
# the one its figures were measured on; bookworm's mirror later served 6.1.176-1, one file more)
LINUX_DOCS_TREES = [
    {"version": "6.1.192-3", "count": 3183, "tree_sha256": "310189f360a1d79af1a178ce121985fa7947a66778ca8ea4c4df87a9545c3cb3"},
    {"version": "6.1.176-1", "count": 3184, "tree_sha256": "bea4d091464fc2091929f0643b2a47f65913cdd7241039ac1ec6ca785082d6cd"},
]


def linux_docs_src():
    """The linux-docs source: the first known tree, the others accepted too (`also`); the
    installed package's tree must be one of them."""
    here = globsrc("linux-doc-6.1", "/usr/share/doc/linux-doc-6.1/Documentation", "**/*.rst.gz")
    known = {(t["count"], t["tree_sha256"]) for t in LINUX_DOCS_TREES}
    assert (here["count"], here["tree_sha256"]) in known, "an unknown linux-doc-6.1 tree: add it to LINUX_DOCS_TREES"
    first, *rest = LINUX_DOCS_TREES
    return {**here, "count": first["count"], "tree_sha256": first["tree_sha256"], "version": first["version"],
            "also": rest}

DATA = Path(__file__).resolve().parent  # the catalogue and the shipped samples
lam = DATA / "lambda_virus.fa"
klebs = sorted(Path("/usr/share/doc/kleborate/examples/data").glob("*.fna.xz"))
D = []
D.append(dict(name="lambda-phage", type="dna", reader="fasta",
  licence="public domain (genome sequence, NCBI NC_001416.1)",
  description="Enterobacteria phage lambda, complete genome (one FASTA record)", size="48.5 kB",
  sources=[{"kind": "shipped", "files": [{"path": "lambda_virus.fa", "sha256": sha256_file(lam)}]},
           files("bowtie2-examples", ["/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz"]),
           {"kind": "url", "files": [{"url": "https://raw.githubusercontent.com/BenLangmead/bowtie2/master/example/reference/lambda_virus.fa",
             "name": "lambda_virus.fa", "sha256": sha256_file(lam)}],
            "note": "sha256 of the Debian copy (decompressed); a download that differs is refused"}]))
kls = DATA / "klebsiella_hs11286_1m.fa.gz"
D.append(dict(name="klebsiella-sample", type="dna", reader="fasta",
  licence="public domain (genome sequence, GenBank CP003200.1)",
  description="first 1,200,000 bytes of the Klebsiella pneumoniae HS11286 FASTA (header + 1.19 Mbp), "
              "cut from Debian kleborate-examples' Klebs_HS11286.fna.xz, gzip -9n; the README's quick-start sample",
  size="1.2 MB",
  sources=[{"kind": "shipped", "files": [{"path": kls.name, "sha256": sha256_file(kls)}]}]))
D.append(dict(name="klebsiella", type="dna", reader="fasta",
  licence="public data (GenBank CP003200, CP003785, CP000647, AP006725)",
  description="four Klebsiella pneumoniae genomes with plasmids, multi-FASTA, xz-compressed", size="22.5 MB",
  sources=[files("kleborate-examples", [str(p) for p in klebs])]))
D.append(dict(name="jargon", type="text", reader="text",
  licence="public domain",
  description="The Jargon File 4.4.7, plain text, gzip-compressed", size="1.7 MB",
  sources=[files("jargon-text", ["/usr/share/doc/jargon-text/jargon.txt.gz"])]))
D.append(dict(name="gcide", type="text", reader="text:encoding=cp1252",
  licence="GPL-2+",
  description="GCIDE dictionary text in dictd format (dictzip = gzip); 3 cp1252 bytes, else ASCII", size="40 MB",
  sources=[files("dict-gcide", ["/usr/share/dictd/gcide.dict.dz"])]))
D.append(dict(name="fortunes", type="text", reader="text:sep=%",
  licence="BSD (fortune-mod)",
  description="fortune cookies, one document per quip (files separated by % lines)", size="0.1 MB",
  sources=[files("fortunes-min", ["/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/literature",
                                  "/usr/share/games/fortunes/riddles"])]))
D.append(dict(name="codec2-speech", type="audio", reader="audio",
  licence="LGPL-2.1",
  description="speech clips, 8 kHz (one 16 kHz) mono WAV, from the codec2 examples", size="4.2 MB",
  sources=[globsrc("codec2-examples", "/usr/share/codec2/wav", "*.wav")]))
D.append(dict(name="alsa-sounds", type="audio", reader="audio",
  licence="GPL-2",
  description="ALSA speaker-test voice prompts (Front Left, ...) and noise, 48 kHz WAV", size="1.2 MB",
  sources=[globsrc("alsa-utils", "/usr/share/sounds/alsa", "*.wav")]))
D.append(dict(name="freedesktop-sounds", type="audio", reader="audio",
  licence="GPL-2+ / CC-BY-3.0 / CC-BY-SA-3.0 per file",
  description="desktop event sounds (bells, clicks, voices), Ogg Vorbis", size="0.5 MB",
  sources=[globsrc("sound-theme-freedesktop", "/usr/share/sounds/freedesktop/stereo", "*.oga")]))
D.append(dict(name="tango-icons", type="image", reader="image",
  licence="public domain",
  description="Tango icons, 32x32 RGBA PNG, real files only (symlinked aliases skipped)", size="0.9 MB",
  sources=[globsrc("tango-icon-theme", "/usr/share/icons/Tango/32x32", "*/*.png")]))
D.append(dict(name="mate-nature", type="image", reader="image:size=64x64",
  licence="GPL-2+",
  description="MATE desktop nature photos, JPEG, up to 2560x1600", size="6.6 MB",
  sources=[globsrc("mate-backgrounds", "/usr/share/backgrounds/mate/nature", "*.jpg")]))
D.append(dict(name="debian-grub", type="image", reader="image:size=64x48",
  licence="GPL-2+ / CC-BY-SA per theme",
  description="Debian theme GRUB background images, PNG", size="1.5 MB",
  sources=[globsrc("desktop-base", "/usr/share/desktop-base", "*-theme/grub/*.png")]))
D.append(dict(name="linux-docs", type="text", reader="text",
  licence="GPL-2",
  description="the Linux kernel's documentation (Documentation/**/*.rst, 3,183 reStructuredText files of "
              "English technical prose, each gzip-compressed) from Debian's linux-doc-6.1 6.1.192-3; "
              "the held-out tail of a run is its last files in path order",
  size="24.2 MB",
  sources=[linux_docs_src()]))
D.append(dict(name="elf-ls", type="binary", reader="raw",
  licence="GPL-3+",
  description="the ELF executable /usr/bin/ls of this machine (no checksum: it differs per build)", size="0.14 MB",
  sources=[{"kind": "local", "files": [{"path": "/usr/bin/ls"}]}]))
D.append(dict(name="lambda-phage-zst", type="zstd", reader="zstd",
  licence="public domain",
  description="the lambda phage FASTA file compressed with zstd level 19 (made locally)", size="14 kB",
  sources=[{"kind": "derived", "from": "lambda-phage", "input": "lambda_virus.fa", "recipe": "zstd-19",
            "name": "lambda_virus.fa.zst", "content_sha256": sha256_file(lam)}]))
cat = {"version": 1,
       "note": "checksums computed from the files of the Debian 12 (bookworm) packages named",
       "datasets": D}
write_atomic(DATA / "catalogue.json", (json.dumps(cat, indent=1) + "\n").encode())
for d in D:
    for s in d["sources"]:
        print(d["name"], s["kind"], s.get("count", ""), s.get("package", ""))
