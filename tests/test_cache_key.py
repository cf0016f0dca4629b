"""The FX-graph-cache key of the passes: every source file of the package, found from the
package itself (a module added to a package changes it, also in a subpackage that lives
outside its parent's folder, as muon_compile.passes does in this repository)."""

import importlib.util
import sys
from pathlib import Path

import muon_compile
import muon_compile.passes
from muon_compile import config
from muon_compile.cache_key import package_sources, sources_hash
from muon_compile.passes import pipeline


def test_every_source_file_of_the_package_is_hashed():
    files = set(package_sources(muon_compile))
    for package in (muon_compile, muon_compile.passes):
        folder = Path(package.__file__).resolve().parent
        assert {str(f) for f in folder.glob("*.py")} <= files, folder
    assert str(Path(pipeline.__file__).resolve()) in files


def _package_with_a_mapped_subpackage(root: Path):
    """``pkg`` in ``root/pkg`` and its subpackage ``pkg.sub`` in ``root/elsewhere``."""
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location("pkg", root / "pkg" / "__init__.py", submodule_search_locations=[str(root / "pkg")])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["pkg"] = pkg
    spec.loader.exec_module(pkg)
    sub_spec = importlib.util.spec_from_file_location(
        "pkg.sub", root / "elsewhere" / "__init__.py", submodule_search_locations=[str(root / "elsewhere")]
    )
    sub = importlib.util.module_from_spec(sub_spec)
    sys.modules["pkg.sub"] = sub
    sub_spec.loader.exec_module(sub)
    return pkg


def test_a_module_added_to_the_package_changes_the_key(tmp_path):
    try:
        pkg = _package_with_a_mapped_subpackage(tmp_path)
        before = sources_hash(pkg)
        (tmp_path / "pkg" / "b.py").write_text("B = 2\n")
        after_parent = sources_hash(pkg)
        (tmp_path / "elsewhere" / "c.py").write_text("C = 3\n")
        after_sub = sources_hash(pkg)
        assert len({before, after_parent, after_sub}) == 3
        assert str((tmp_path / "elsewhere" / "c.py").resolve()) in package_sources(pkg)
    finally:
        sys.modules.pop("pkg", None)
        sys.modules.pop("pkg.sub", None)


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
