"""Where retrofit caches: RETROFIT_CACHE, else under HF_HOME (one variable isolates both caches), else the
XDG cache (issue 44, item 8)."""

from pathlib import Path

from retrofit.models.assets import cache_root


def test_cache_root_follows_retrofit_cache_then_hf_home_then_xdg(monkeypatch, tmp_path):
    for k in ("RETROFIT_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "retrofit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "retrofit"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cache_root() == tmp_path / "hf" / "retrofit"
    monkeypatch.setenv("RETROFIT_CACHE", str(tmp_path / "mine"))
    assert cache_root() == Path(tmp_path / "mine")
