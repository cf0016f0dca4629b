"""The FX-graph-cache key of the passes: every source file of the package, found from the
package itself (a module added to the package or a subpackage changes it), the advisor
left out."""

import os
import sys
from pathlib import Path

import muon_compile
import muon_compile.passes
from muon_compile import config
from muon_compile.compile.cache_key import NOT_COMPILED, package_sources, sources_hash
from torch._inductor.custom_graph_pass import get_hash_for_files
from muon_compile.passes import pipeline


def test_every_source_file_of_the_package_is_hashed():
    files = set(package_sources(muon_compile))
    for package in (muon_compile, muon_compile.passes):
        folder = Path(package.__file__).resolve().parent
        assert {str(f) for f in folder.glob("*.py")} <= files, folder
    assert str(Path(pipeline.__file__).resolve()) in files


def test_a_module_added_to_the_package_changes_the_key(tmp_path):
    """A module added to the package or to a subpackage changes the key; one added to a
    subpackage left out does not."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "skipped").mkdir()
    pkg = type(sys)("pkg")
    pkg.__path__ = [str(tmp_path / "pkg")]
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")

    def key():
        return get_hash_for_files(package_sources(pkg, ("skipped",)))

    before = key()
    (tmp_path / "pkg" / "b.py").write_text("B = 2\n")
    after_parent = key()
    (tmp_path / "pkg" / "sub" / "c.py").write_text("C = 3\n")
    after_sub = key()
    (tmp_path / "pkg" / "skipped" / "d.py").write_text("D = 4\n")
    assert len({before, after_parent, after_sub}) == 3
    assert key() == after_sub
    assert str((tmp_path / "pkg" / "sub" / "c.py").resolve()) in package_sources(pkg)


def test_the_advisor_and_the_models_are_not_in_the_key():
    files = package_sources(muon_compile, NOT_COMPILED)
    assert files and not any("/advisor/" in f or f.endswith("/muon_compile/models.py") for f in files)
    assert set(files) < set(package_sources(muon_compile))


def test_the_pass_uuid_holds_the_sources_hash_and_the_configuration(monkeypatch):
    cfg = config.current()
    key = pipeline.MuonGraphPass(cfg).uuid()
    assert key[0] == sources_hash(muon_compile)
    monkeypatch.setattr(pipeline, "sources_hash", lambda package: b"another tree")
    assert pipeline.MuonGraphPass(cfg).uuid() != key
    monkeypatch.undo()
    with config.override(bucket_mb=1.0) as other:
        assert pipeline.MuonGraphPass(other).uuid() != key
    assert pipeline.MuonGraphPass(cfg, rank_key=(1, ((3, 16),))).uuid() != key
    # under Triton's interpreter the CPU runs the package's kernels, and stack_writes plans for them
    monkeypatch.setenv("TRITON_INTERPRET", "0" if os.environ.get("TRITON_INTERPRET") == "1" else "1")
    assert pipeline.MuonGraphPass(cfg).uuid() != key
