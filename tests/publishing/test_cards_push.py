"""Model cards rendered from a real tiny run, and `retrofit push` up to the HfApi call boundary
(the Hub is unreachable here): the calls, their arguments, the uploaded folder, dry runs, tokens."""

from __future__ import annotations

import filecmp
import json
import logging
import os
import re
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

from retrofit.cli import main
from retrofit.foundation.errors import HubError, OptionError
from retrofit.foundation.run_folder import published_weights
from retrofit.publishing import card_facts, cards, hub

from ..pipeline_run import REPO, copy_run, shared_run

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

TOKEN = "hf_retrofitTestToken0123456789abcdefXYZ"
ALLOWED = re.compile(
    r"^(native/)?([\w.-]+\.safetensors|model\.safetensors\.index\.json|config\.json|generation_config\.json"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|vocab\.json|merges\.txt)$"
    r"|^README\.md$|^eval/(report\.json|report\.md|[\w-]+\.png)$"
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return shared_run(tmp_path_factory)


@pytest.fixture
def fresh(run_dir, tmp_path):
    """A copy of the run (checkpoints included, to prove they are never uploaded)."""
    copy = copy_run(run_dir, tmp_path / "run")
    ckpt = copy / "checkpoints" / "step_00000004"
    ckpt.mkdir(parents=True)
    for name in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl", "model.safetensors"):
        (ckpt / name).write_bytes(b"state")
    shutil.copy(copy / "final" / "config.json", copy / "final" / "optimizer.pt")  # a stray file in final/
    return copy


class FakeApi:
    """Stands in for huggingface_hub.HfApi: records calls and the uploaded folder's contents."""

    calls: list = []
    uploaded: dict = {}

    def __init__(self, token=None, **kw):
        FakeApi.calls.append(("init", {"token": token, **kw}))

    def create_repo(self, **kw):
        FakeApi.calls.append(("create_repo", kw))
        return f"https://huggingface.co/{kw['repo_id']}"

    def create_branch(self, **kw):
        FakeApi.calls.append(("create_branch", kw))

    def upload_folder(self, **kw):
        FakeApi.calls.append(("upload_folder", kw))
        root = Path(kw["folder_path"])
        FakeApi.uploaded = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        return huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{kw['repo_id']}/commit/abc",
            commit_message="m",
            commit_description="",
            oid="abc",
        )


@pytest.fixture
def fake_api(monkeypatch):
    FakeApi.calls, FakeApi.uploaded = [], {}
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    return FakeApi


@pytest.fixture
def no_hub(monkeypatch):
    """Any HfApi use fails the test."""

    def boom(*a, **k):
        raise AssertionError("HfApi must not be called")

    monkeypatch.setattr(huggingface_hub, "HfApi", boom)


# ---- cards ---------------------------------------------------------------------------------------------
def _card(run_dir) -> ModelCard:
    return ModelCard((run_dir / "README.md").read_text())


def test_card_metadata_is_valid_hub_metadata(run_dir):
    card = _card(run_dir)
    meta = card.data.to_dict()
    assert {"library_name", "tags", "license", "datasets", "pipeline_tag", "model-index"} <= set(meta)
    assert meta["pipeline_tag"] == "text-generation" and meta["license"] == "apache-2.0"
    assert {"retrofit", "alibi"} <= set(meta["tags"]) and isinstance(meta["datasets"], list)
    assert "base_model" not in meta  # tiny-gpt2 is retrofit's own model, not a Hub id
    _name, results = model_index_to_eval_results(meta["model-index"])
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    main_rows = [
        r for r in report["rows"] if r["model"] == report["models"][0]["name"] and r["method"] == "non-overlapping"
    ]
    assert [round(r["ppl"], 4) for r in main_rows] == [e.metric_value for e in results]
    assert all(e.metric_type == "perplexity" and e.task_type == "text-generation" for e in results)
    assert card.data.eval_results  # huggingface_hub parsed the model-index itself


def test_card_body_holds_budget_tables_plots_loading_and_limits(run_dir):
    text = (run_dir / "README.md").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    info = json.loads((run_dir / "versions.json").read_text())
    for needle in (
        "## Base model",
        "## Conversion",
        "## Fine-tune budget",
        "## Evaluation",
        "### Passkey retrieval",
        "## How to load",
        "## Limitations",
        "apache-2.0",
        "**alibi**",
        "(original)",
        "sliding",
        f"{summary['steps']:,} ×",
        f"{info['trainable_parameters']:,}",
        "from_pretrained(",
    ):
        assert needle in text, needle
    if published_weights(run_dir) == "retrofit":
        assert "retrofit.load(" in text
    for img in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (run_dir / img).is_file(), img
    assert "TODO" not in text and "{{" not in text


def test_card_trend_words_follow_the_numbers(run_dir):
    """'perplexity does not rise from 101.82 at 128 to 101.94 at 2,048' contradicted itself (issue 17)."""
    text = (run_dir / "README.md").read_text()
    verb, a, b = re.search(
        r"perplexity (rises|falls|is unchanged)(?: slightly \(under 2%\))? from ([\d,.]+) at [\d,]+ to "
        r"([\d,.]+) at",
        text,
    ).groups()
    a, b = (float(x.replace(",", "")) for x in (a, b))
    assert verb == ("rises" if b > a else "falls" if b < a else "is unchanged"), (verb, a, b)
    assert [card_facts._trend(101.82, x) for x in (101.94, 101.70, 150.0, 50.0, 101.82)] == [
        "rises slightly (under 2%) from",
        "falls slightly (under 2%) from",
        "rises from",
        "falls from",
        "is unchanged from",
    ]


def test_card_for_a_hub_base_model_names_it_and_its_licence(run_dir, tmp_path):
    copy = copy_run(run_dir, tmp_path / "run")
    recipe = yaml.safe_load((copy / "run.yaml").read_text())
    recipe["model"]["name_or_path"] = "gpt2"
    recipe["card"]["tags"] = ["demo"]
    (copy / "run.yaml").write_text(yaml.safe_dump(recipe))
    meta = ModelCard(cards.render_card(copy)).data.to_dict()
    assert meta["base_model"] == "gpt2" and meta["license"] == "mit" and "demo" in meta["tags"]


def test_card_cli_and_bundled_template(run_dir, tmp_path, capsys):
    assert main(["card", str(run_dir), "--print"]) == 0
    assert capsys.readouterr().out == cards.render_card(run_dir)
    assert filecmp.cmp(
        REPO / "model_cards" / "model_card.md.j2", cards.TEMPLATE_DIR / cards.DEFAULT_TEMPLATE, shallow=False
    )
    custom = tmp_path / "mine.md.j2"
    custom.write_text("---\n{{ metadata | yaml }}---\n# {{ title }}: {{ eval.rows[0].ppl | num }}\n")
    assert main(["card", str(run_dir), "--template", str(custom), "--out", str(tmp_path / "c.md")]) == 0
    assert (tmp_path / "c.md").read_text().startswith("---\nlibrary_name:")


# ---- push ----------------------------------------------------------------------------------------------
def _expected(run_dir: Path) -> set:
    names = {"README.md", "eval/report.json", "eval/report.md"} | {
        f"eval/{p.name}" for p in (run_dir / "eval").glob("*.png")
    }
    root = "export" if published_weights(run_dir) == "native" else "final"
    names |= {p.name for p in (run_dir / root).iterdir() if ALLOWED.match(p.name)}
    if (run_dir / "export").is_dir() and root == "final":
        names |= {f"native/{p.name}" for p in (run_dir / "export").iterdir() if ALLOWED.match(f"native/{p.name}")}
    return names


def test_push_calls_hfapi_with_the_right_arguments_and_folder(fresh, fake_api, monkeypatch, caplog, capsys):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with caplog.at_level(logging.DEBUG):
        rc = main(["-v", "push", str(fresh), "--repo", "someone/tiny-alibi", "--private", "--revision", "dev"])
    assert rc == 0
    kinds = [c[0] for c in fake_api.calls]
    assert kinds == ["init", "create_repo", "create_branch", "upload_folder"]
    calls = dict(fake_api.calls)
    assert calls["init"]["token"] == TOKEN
    assert calls["create_repo"] == {
        "repo_id": "someone/tiny-alibi",
        "repo_type": "model",
        "private": True,
        "exist_ok": True,
    }
    assert calls["create_branch"]["branch"] == "dev"
    up = calls["upload_folder"]
    assert up["repo_id"] == "someone/tiny-alibi" and up["revision"] == "dev" and up["repo_type"] == "model"
    assert set(fake_api.uploaded) == _expected(fresh)
    assert all(ALLOWED.match(n) for n in fake_api.uploaded)
    assert not any(
        re.search(r"optimizer|scheduler|random_states|checkpoint|\.pkl|\.bin|log\.jsonl|manifest", n)
        for n in fake_api.uploaded
    )
    # the folder's generated (local) card, rendered again for the repo; nothing written into the folder
    assert fake_api.uploaded["README.md"] == cards.card_text(fresh, repo="someone/tiny-alibi").encode()
    assert b'from_pretrained("someone/tiny-alibi")' in fake_api.uploaded["README.md"]
    assert "someone/tiny-alibi" not in (fresh / "README.md").read_text()
    assert fake_api.uploaded["eval/report.json"] == (fresh / "eval" / "report.json").read_bytes()
    # the token is nowhere but in the HfApi call
    out = capsys.readouterr()
    assert TOKEN not in caplog.text and TOKEN not in out.out + out.err
    assert not any(TOKEN.encode() in data for data in fake_api.uploaded.values())
    assert not any(TOKEN.encode() in p.read_bytes() for p in fresh.rglob("*") if p.is_file())


def test_push_main_branch_creates_no_branch(fresh, fake_api, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    result = hub.push(fresh, "someone/tiny-alibi")
    assert [c[0] for c in fake_api.calls] == ["init", "create_repo", "upload_folder"]
    assert dict(fake_api.calls)["create_repo"]["private"] is False
    assert result["commit_url"].endswith("/commit/abc")


def test_dry_run_lists_files_with_sizes_and_calls_nothing(fresh, no_hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert main(["push", str(fresh), "--repo", "someone/tiny-alibi", "--dry-run"]) == 0
    out = capsys.readouterr().out
    listed = dict(re.findall(r"^  (\S+)\s+([\d,.]+ (?:B|KiB|MiB|GiB))$", out, re.MULTILINE))
    assert set(listed) == _expected(fresh)
    assert f"{len(listed)} files" in out and TOKEN not in out and "token: HF_TOKEN" in out
    plan = dict(hub.upload_plan(fresh, "someone/tiny-alibi"))
    assert listed["README.md"] == hub._human(len(plan["README.md"]))


def _listing(folder: Path) -> list:
    return sorted(
        (
            p.relative_to(folder).as_posix(),
            p.is_dir(),
            p.stat().st_mtime_ns,
            p.stat().st_size,
            None if p.is_dir() else p.read_bytes(),
        )
        for p in [folder, *folder.rglob("*")]
    )


@pytest.mark.parametrize("card", ["generated", "none"])
def test_dry_run_writes_nothing(fresh, no_hub, monkeypatch, capsys, card):
    """Issue 32 item 10: a dry run wrote the card into the folder (and crashed on a read-only one)."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    if card == "none":
        (fresh / "README.md").unlink()
    before = _listing(fresh)
    modes = {p: p.stat().st_mode for p in [fresh, *fresh.rglob("*")] if p.is_dir()}
    try:
        for p in modes:
            p.chmod(0o555)  # read-only (root ignores it: the listing check is what proves it)
        assert main(["push", str(fresh), "--repo", "someone/tiny-alibi", "--dry-run"]) == 0
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert _listing(fresh) == before
    assert "README.md" in capsys.readouterr().out


def test_a_hand_edited_card_is_uploaded_as_it_is(fresh):
    text = (fresh / "README.md").read_text()
    (fresh / "README.md").write_text(text.replace(cards.AUTO_MARK, "My own words."))
    plan = dict(hub.upload_plan(fresh, "someone/tiny-alibi"))
    assert plan["README.md"] == fresh / "README.md"


def test_missing_token_is_a_clear_error_before_any_upload(fresh, no_hub, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(HubError, match="HF_TOKEN"):
        hub.push(fresh, "someone/tiny-alibi")
    assert main(["push", str(fresh), "--repo", "someone/tiny-alibi"]) == HubError.exit_code == 5
    assert "no Hugging Face token" in capsys.readouterr().err


def test_token_from_the_login_cache(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_cached")
    assert hub.get_token() == "hf_cached" and hub.token_source() == "the login cache"


def test_hub_errors_never_echo_the_token(fresh, monkeypatch):
    class Failing(FakeApi):
        def upload_folder(self, **kw):
            raise RuntimeError(f"401 Unauthorized for token {TOKEN}")

    monkeypatch.setattr(huggingface_hub, "HfApi", Failing)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(HubError) as e:
        hub.push(fresh, "someone/tiny-alibi")
    assert TOKEN not in str(e.value) and "***" in str(e.value)


@pytest.mark.parametrize("repo", ["noslash", "a/b/c", "user/", "/name", "user/na me", "user/../x"])
def test_bad_repo_ids(fresh, repo):
    with pytest.raises(OptionError, match="user/name"):
        hub.push(fresh, repo, dry_run=True)


def test_pipeline_pushes_when_the_recipe_names_a_repo(fresh, fake_api, monkeypatch):
    import retrofit

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    retrofit.run(fresh / "run.yaml", overrides=["push.repo=someone/tiny-alibi"])
    e = json.loads((fresh / "manifest.json").read_text())["stages"]["push"]
    assert e["status"] == "done" and e["repo"] == "someone/tiny-alibi" and e["commit_url"].endswith("/commit/abc")
    assert TOKEN not in (fresh / "manifest.json").read_text()
    meta = ModelCard((fresh / "README.md").read_text()).data.to_dict()
    assert meta["model-index"][0]["name"] == "someone/tiny-alibi"  # the card was re-rendered for the repo
    assert os.environ["HF_TOKEN"] == TOKEN


# ---- issue 32 items 6 and 11: the card says what the run holds and where ----------------------------------
def test_card_install_line_names_the_pyproject_distribution(fresh):
    """PyPI's 'retrofit' is someone else's project: the card installs the name pyproject.toml declares."""
    import tomllib

    import retrofit

    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert name == retrofit.DISTRIBUTION != "retrofit"
    shutil.rmtree(fresh / "export")  # no native export: loading needs retrofit, so the card says what to install
    text = cards.render_card(fresh)
    assert re.findall(r"pip install (\S+)", text) == [name]
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md"), cards.TEMPLATE_DIR / cards.DEFAULT_TEMPLATE]:
        assert not re.search(r"pip install retrofit(?![\w-])", doc.read_text()), doc


def _converted_folder(tmp_path, factory: str, scheme: str) -> Path:
    import retrofit

    from ..tiny import TINY

    model = TINY[factory]()
    retrofit.convert(model, scheme)
    return retrofit.save(model, tmp_path / f"{factory}-{scheme}")


def test_card_native_mechanism_follows_the_checkpoint(tmp_path):
    """The SmolLM2 (RoPE) card spoke of a 'native position table ... frozen and unused': it has none."""
    table = cards.render_card(_converted_folder(tmp_path, "gpt2", "alibi"))
    assert "native learned position table (32 rows) is kept in the weights" in table and "RoPE" not in table
    rope = cards.render_card(_converted_folder(tmp_path, "llama", "alibi"))
    assert "native rotary embedding (RoPE, which has no weights) is switched off" in rope
    assert "position table" not in rope


def test_card_loads_from_the_repo_or_from_the_local_folder(fresh):
    shutil.rmtree(fresh / "export")  # the retrofit checkpoint in final/ is what loads
    local = cards.render_card(fresh)
    assert f'from_pretrained("{fresh / "final"}")' in local and f'retrofit.load("{fresh / "final"}")' in local
    assert "REPO_ID" not in local and "weights at the root" not in local
    hub_card = cards.render_card(fresh, repo="someone/tiny-alibi")
    assert 'from_pretrained("someone/tiny-alibi")' in hub_card and "weights at the root are a retrofit" in hub_card
    assert str(fresh) + "/final" not in hub_card and "REPO_ID" not in hub_card


def test_card_with_an_export_loads_it_from_where_it_is(fresh):
    record = json.loads((fresh / "export" / "retrofit_export.json").read_text())
    local, hub_card = cards.render_card(fresh), cards.render_card(fresh, repo="someone/tiny-alibi")
    if record["exact"]:  # the export replaces the checkpoint at the repo's root
        assert f'from_pretrained("{fresh / "export"}")' in local and f"`{fresh / 'final'}/`" in local
        assert 'from_pretrained("someone/tiny-alibi")' in hub_card and "subfolder" not in hub_card
    else:
        assert f'from_pretrained("{fresh / "export"}")' in local and 'subfolder="native"' not in local
        assert 'from_pretrained("someone/tiny-alibi", subfolder="native")' in hub_card


def _edit_report(run: Path, keep) -> None:
    path = run / "eval" / "report.json"
    report = json.loads(path.read_text())
    report["rows"] = [r for r in report["rows"] if keep(r, report)]
    report["cost"] = [c for c in report.get("cost") or [] if keep(c, report)]
    report["models"] = [m for m in report["models"] if any(r["model"] == m["name"] for r in report["rows"])]
    report["settings"]["lengths"] = sorted({r["length"] for r in report["rows"]})
    path.write_text(json.dumps(report))


def test_card_quality_line_follows_the_reports_columns(fresh):
    """'Compare the 1x column' where the table has no such column: the line says what the report holds."""
    text = cards.render_card(fresh)
    assert "1x column" not in text and "vs the original's" in text
    _edit_report(fresh, lambda r, rep: "(original)" not in r["model"])
    text = cards.render_card(fresh)
    assert "original was not evaluated alongside it (`--baseline original` adds it)" in text
    assert "1x column" not in text
    _edit_report(fresh, lambda r, rep: r["length"] != 64)
    text = cards.render_card(fresh)
    assert "no column at its native length (64 tokens; measured: 128, 256)" in text


def test_card_states_what_the_model_reads_as_measured(run_dir):
    """Issue 41: the card states what the model uses past native as measured (the eval report's verdict: runs or
    breaks down, its far-context gain with the interval, its effective reach), not the configured limit alone;
    the same sentences as report.md."""
    from retrofit.evaluation.verdict import lines

    text = (run_dir / "README.md").read_text()
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    mine = [m for m in report["verdict"]["models"] if m["model"] == report["models"][0]["name"]]
    assert mine and "own" in mine[0] and "reach" in mine[0], "the default eval measures both"
    said = lines({"models": mine, "passkey_uninformative": [], "recall_uninformative": []})
    assert all(line in text for line in said), said
    assert f"gain {mine[0]['own']['gain']:.4f}" in text and "Effective reach" in text
