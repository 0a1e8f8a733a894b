"""Hostile inputs against four surfaces of issue 51 not swept before, counted by class.

The project's rule: bad input gets one ``kvasym: error:`` line naming the offending key, file or
value and a non-zero exit, never a traceback; no result is left half-written under its final
name looking complete; no file of the user's is moved, changed or deleted.

1. ``kvasym card --out DIR`` on its output folder: absent, empty, holding the user's files or an
   older card, a regular file, a symbolic link (to a folder, a file, nowhere, itself, a
   read-only folder), a path whose parent is missing or is a file, read-only (a read-only tmpfs,
   since root ignores permission bits), the empty string. Either every file of the card is
   written and nothing else changes, or one error line, before the model is loaded, and nothing
   changes at all (a snapshot of the whole folder, bytes and links, before and after).
2. A model job killed with SIGKILL (in a subprocess that kills itself at a chosen point: a
   file cut short mid-write, before or after each rename, at the model's load): the card
   command, ``kvasym stage e2e`` and ``kvasym stage sensitivity`` on the tiny qwen2 fixture
   (a stage writes each output atomically on its own: a kill between two outputs is a case).
   Afterwards every file under a final name is whole (the new run's bytes, or the older card's),
   a card's ``card.json`` stands only beside its own complete set, leftovers are hidden
   ``.<name>.<random>.tmp`` names only, and the rerun writes the uninterrupted run's bytes.
3. A full disk: a tiny tmpfs (real ENOSPC from pyarrow and Python) and the writers made to fail
   with ENOSPC, as OSError with an errno and as pyarrow's message without one, at each write and
   each rename: exit 1, one line naming the file and the cause, nothing at the output path.
4. ``kvasym stage crate`` on a partial run: outputs missing, emptied, cut short, a damaged
   ledger, paths outside the root or through symbolic links, stale hidden parts. The crate lists
   exactly the files there (true size and SHA-256), or refuses, naming the file.

The compute of the card is measured once (the real measurement on the fixture) and replayed for
the cases that only exercise the writing, so the file runs in well under a minute.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from kvasym.cli import main  # noqa: E402
from kvasym.real.card_cli import OUTPUT_FILES  # noqa: E402
from test_faults import _mount_tmpfs  # noqa: E402  (mounts a tmpfs, or says why it cannot)

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "tiny_gguf" / "qwen2_biases_q8_0.gguf"
CARD_ARGS = ["--tokens", "8", "--budgets", "2", "--widths", "1", "2", "--frontier-schemes", "--draws", "1"]
_RKV = {"name": "RKV", "K": {"rotate": True, "scalar_bits": "n", "qjl": False},
        "V": {"rotate": True, "scalar_bits": "n", "qjl": False}}
_KV = {"name": "KV", "K": {"rotate": False, "scalar_bits": "n", "qjl": False},
       "V": {"rotate": False, "scalar_bits": "n", "qjl": False}}
E2E_SLICE = {"text": "bicycle_repair", "max_tokens": 16, "schemes": [_KV, _RKV], "budgets": [2], "base_seed": 7,
             "norm_dtype": "float32",
             "e2e": {"draws": 1, "rope": {"post": ["KV", "RKV"]}, "extra_budgets": {}, "own": "exact",
                     "sensitivity_layers": [0, 1], "sensitivity_schemes": ["RKV"]}}
SENSITIVITY_SLICE = {"text": "allotment_spring", "evaluation_texts": ["bicycle_repair"], "max_tokens": 16,
                     "scheme": _RKV, "widths": [1, 2, 3], "granularity": "layer", "base_seed": 7,
                     "norm_dtype": "float32"}
ENOSPC = os.strerror(errno.ENOSPC)  # "No space left on device"

# --------------------------------------------------------------------------- helpers


def error_line(err: str) -> str:
    """The one ``kvasym: error:`` line of a run's stderr (and no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("kvasym: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything under ``root``, links not followed: kind, bytes of files, targets of links."""
    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                found[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                found[rel] = ("folder",)
            elif p.is_file():
                found[rel] = ("file", p.read_bytes(), p.stat().st_ino)
            else:
                found[rel] = ("other",)
    return found


def leftovers(folder: Path, names) -> list[str]:
    """Entries of ``folder`` that are neither in ``names`` nor a hidden ``.tmp`` staging name."""
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in names and not (p.name.startswith(".") and p.name.endswith(".tmp")))




@contextmanager
def tmpfs(where: Path, size: str, fill=None, read_only: bool = False):
    """A tmpfs of ``size`` at ``where`` (filled by ``fill(where)``, then remounted read-only when
    asked); skips the test when it cannot be mounted (not root, no mount)."""
    where.mkdir(parents=True, exist_ok=True)
    reason = _mount_tmpfs(where, f"size={size}")
    if reason is not None:
        pytest.skip(f"NOT TESTED: cannot mount a tmpfs ({reason})")
    try:
        if fill is not None:
            fill(where)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, timeout=30)
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], capture_output=True, timeout=30)


# --------------------------------------------------------------------------- the model, the references


@pytest.fixture(scope="module")
def tiny_model():
    from kvasym.real.gguf_model import GGUFLlama

    return GGUFLlama.load(FIXTURE)


@pytest.fixture(scope="module")
def card_reference(tmp_path_factory, tiny_model):
    """The card of the fixture, measured for real once: its files' bytes, and what
    ``measure_card`` and ``render_card_html`` returned (replayed below and in the subprocesses)."""
    import kvasym.real.card as card_module
    import kvasym.render.card_page as page_module

    out = tmp_path_factory.mktemp("card_reference") / "card"
    seen = {}
    real_measure, real_render = card_module.measure_card, page_module.render_card_html

    def measure(*args, **kwargs):
        seen["measured"] = real_measure(*args, **kwargs)
        return seen["measured"]

    def render(card):
        seen["html"] = real_render(card)
        return seen["html"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(card_module, "measure_card", measure)
        mp.setattr(page_module, "render_card_html", render)
        assert main(["card", str(FIXTURE), "--out", str(out), *CARD_ARGS]) == 0
    replay = out.parent / "replay.pickle"
    replay.write_bytes(pickle.dumps(seen))
    return SimpleNamespace(files={name: (out / name).read_bytes() for name in OUTPUT_FILES}, replay=replay, **seen)


@pytest.fixture
def replay_card(monkeypatch, card_reference, tiny_model):
    """The card command with the reference's measurement and page replayed and the model loaded
    once; ``loads`` counts the model loads (a refusal must come before the first)."""
    import kvasym.real.card as card_module
    import kvasym.render.card_page as page_module
    from kvasym.real.gguf_model import GGUFLlama

    loads = []

    def load(cls, path=None, *args, **kwargs):
        loads.append(path)
        return tiny_model

    monkeypatch.setattr(GGUFLlama, "load", classmethod(load))
    monkeypatch.setattr(card_module, "measure_card", lambda *a, **k: card_reference.measured)
    monkeypatch.setattr(page_module, "render_card_html", lambda card: card_reference.html)
    return SimpleNamespace(loads=loads, reference=card_reference)


def card(out, *extra: str) -> int:
    return main(["card", str(FIXTURE), "--out", str(out), *CARD_ARGS, *extra])


@pytest.fixture
def tiny_stages(monkeypatch, tiny_model):
    """Stages e2e and sensitivity run on the tiny fixture (in this process)."""
    from kvasym.real import gguf_model, models

    monkeypatch.setattr(gguf_model.GGUFLlama, "load", classmethod(lambda cls, path=None, *a, **k: tiny_model))
    monkeypatch.setattr(models, "slice_model", lambda slice_, path=None: tiny_model)


def e2e_argv(out: Path) -> list[str]:
    return ["stage", "e2e", "--slice", json.dumps(E2E_SLICE), "--out", str(out / "e2e.parquet")]


def _declares(stage: str, flag: str) -> bool:
    import argparse

    from kvasym.stages import stage_module

    parser = argparse.ArgumentParser()
    stage_module(stage).add_arguments(parser)
    return any(flag in action.option_strings for action in parser._actions)


# the sensitivity stage writes the head statistics beside its table where it declares --out-heads
# (a two-output job: a kill between its writes is a case of its own)
SENSITIVITY_OUTPUTS = ("sensitivity.parquet", "heads.parquet") if _declares("sensitivity", "--out-heads") \
    else ("sensitivity.parquet",)


def sensitivity_argv(out: Path) -> list[str]:
    argv = ["stage", "sensitivity", "--slice", json.dumps(SENSITIVITY_SLICE), "--out", str(out / "sensitivity.parquet")]
    return argv + (["--out-heads", str(out / "heads.parquet")] if len(SENSITIVITY_OUTPUTS) == 2 else [])


STAGES = {"e2e": (e2e_argv, ("e2e.parquet",)), "sensitivity": (sensitivity_argv, SENSITIVITY_OUTPUTS)}


@pytest.fixture(scope="module")
def stage_reference(tmp_path_factory, tiny_model):
    """Each stage's outputs, uninterrupted, on the tiny fixture: file name -> bytes."""
    from kvasym.real import gguf_model, models

    refs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_model.GGUFLlama, "load", classmethod(lambda cls, path=None, *a, **k: tiny_model))
        mp.setattr(models, "slice_model", lambda slice_, path=None: tiny_model)
        for stage, (argv, names) in STAGES.items():
            out = tmp_path_factory.mktemp(f"{stage}_reference")
            assert main(argv(out)) == 0
            refs[stage] = {name: (out / name).read_bytes() for name in names}
    return refs


# =========================================================================== class 1: the card's --out


def put(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text or bytes) at ``path``; None, so that a case's setup can chain with ``or``."""
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def _user_files(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "data.parquet").write_bytes(b"my own table, not a card's")
    (folder / "sub").mkdir()
    (folder / "sub" / "x").write_text("x")
    (folder / ".hidden").write_text("h")


def _fail_the_nth_rename(monkeypatch, atomic, n: int) -> list:
    """Make the ``n``-th ``os.replace`` of kvasym.atomic fail with ENOSPC (a disk full while a
    file is renamed into place); the destinations asked for, in order."""
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == n:
            raise OSError(errno.ENOSPC, ENOSPC)
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    return calls


def _older_card(folder: Path, names=OUTPUT_FILES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(f"an older card's {name}".encode())


def _fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


# name -> (setup(base) -> (out, extra args), expected): expected "written" (the card lands in
# the folder `out` resolves to) or (exit status, fragment of the error line).
OUT_CASES = {
    "absent": (lambda b: (b / "card", []), "written"),
    "absent_with_missing_parents": (lambda b: (b / "x" / "y" / "z" / "card", []), "written"),
    "empty_folder": (lambda b: ((b / "card").mkdir() or b / "card", []), "written"),
    "users_files": (lambda b: (_user_files(b / "card") or b / "card", []), "written"),
    "users_files_like_staging_names": (
        lambda b: ((b / "card").mkdir() or put(b / "card" / ".card.json.abc123.tmp", "mine")
                   or put(b / "card" / "card.json.bak", "mine") or b / "card", []), "written"),
    "older_card": (lambda b: (_older_card(b / "card") or b / "card", []), (2, "already holds card.json")),
    "older_card_overwrite": (lambda b: (_older_card(b / "card") or _user_files(b / "card") or b / "card",
                                        ["--overwrite"]), "written"),
    "older_card_without_json_overwrite": (lambda b: (_older_card(b / "card", OUTPUT_FILES[2:]) or b / "card",
                                                     ["--overwrite"]), "written"),
    "card_json_a_folder_overwrite": (lambda b: ((b / "card" / "card.json").mkdir(parents=True) or b / "card",
                                                ["--overwrite"]), (2, "card.json: exists and is not a regular file")),
    "heads_a_folder_overwrite": (lambda b: ((b / "card" / "heads.parquet").mkdir(parents=True) or b / "card",
                                            ["--overwrite"]), (2, "heads.parquet: exists and is not a regular file")),
    "card_json_a_fifo_overwrite": (lambda b: (_fifo(b / "card" / "card.json") or b / "card", ["--overwrite"]),
                                   (2, "card.json: exists and is not a regular file")),
    "card_json_a_dangling_link": (lambda b: ((b / "card").mkdir() or os.symlink(b / "nowhere", b / "card" / "card.json")
                                             or b / "card", []), (2, "already holds card.json")),
    "card_json_a_link_to_users_file_overwrite": (
        lambda b: (put(b / "mine.json", "{}") or (b / "card").mkdir()
                   or os.symlink(b / "mine.json", b / "card" / "card.json") or b / "card", ["--overwrite"]), "written"),
    "heads_a_hard_link_to_users_file_overwrite": (
        lambda b: (put(b / "mine.parquet", "mine") or (b / "card").mkdir()
                   or os.link(b / "mine.parquet", b / "card" / "heads.parquet") or b / "card", ["--overwrite"]),
        "written"),
    "a_regular_file": (lambda b: (put(b / "card", "mine") or b / "card", []),
                       (2, "exists and is not a folder")),
    "a_regular_file_with_slash": (lambda b: (put(b / "card", "mine") or f"{b / 'card'}/", []),
                                  (2, "exists and is not a folder")),
    "the_model_file": (lambda b: (FIXTURE, []), (2, "exists and is not a folder")),
    "dev_null": (lambda b: ("/dev/null", []), (2, "exists and is not a folder")),
    "link_to_a_folder": (lambda b: ((b / "target").mkdir() or os.symlink(b / "target", b / "card") or b / "card", []),
                         "written"),
    "link_to_a_link_to_a_folder": (
        lambda b: ((b / "target").mkdir() or os.symlink(b / "target", b / "hop") or os.symlink(b / "hop", b / "card")
                   or b / "card", []), "written"),
    "link_to_a_folder_holding_a_card": (
        lambda b: (_older_card(b / "target") or os.symlink(b / "target", b / "card") or b / "card", []),
        (2, "already holds card.json")),
    "link_to_a_file": (lambda b: (put(b / "f", "mine") or os.symlink(b / "f", b / "card") or b / "card", []),
                       (2, "exists and is not a folder")),
    "dangling_link": (lambda b: (os.symlink(b / "nowhere", b / "card") or b / "card", []),
                      (2, "is a symbolic link that leads to no folder")),
    "link_loop": (lambda b: (os.symlink(b / "card", b / "card") or b / "card", []),
                  (2, "is a symbolic link that leads to no folder")),
    "parent_a_file": (lambda b: (put(b / "f", "mine") or b / "f" / "card", []), (2, "f is not a folder")),
    "grandparent_a_file": (lambda b: (put(b / "f", "mine") or b / "f" / "a" / "card", []),
                           (2, "f is not a folder")),
    "parent_a_dangling_link": (lambda b: (os.symlink(b / "nowhere", b / "p") or b / "p" / "card", []),
                               (2, "p is a symbolic link that leads to no folder")),
    "parent_a_fifo": (lambda b: (_fifo(b / "p") or b / "p" / "card", []), (2, "p is not a folder")),
    "empty_string": (lambda b: ("", []), (2, "--out '' is empty")),
    "blank": (lambda b: ("  ", []), (2, "--out '  ' is empty")),
    "dot_with_users_files": (lambda b: (_user_files(b) or ".", []), "written"),
    "spaces_and_unicode": (lambda b: (b / "my card ü", []), "written"),
}
_ONE_NAME = {f"holds_only_{name}": (lambda b, n=name: (_older_card(b / "card", [n]) or b / "card", []),
                                    (2, f"already holds {name}")) for name in OUTPUT_FILES}
OUT_CASES.update(_ONE_NAME)


@pytest.mark.parametrize("case", list(OUT_CASES))
def test_card_output_folder(case, tmp_path, monkeypatch, capsys, replay_card) -> None:
    base = tmp_path / "base"
    base.mkdir()
    monkeypatch.chdir(base)  # "" and "." are the working folder
    setup, expected = OUT_CASES[case]
    out, extra = setup(base)
    before = snapshot(base)
    code = card(out, *extra)
    err = capsys.readouterr().err
    after = snapshot(base)
    if expected == "written":
        assert code == 0, err
        home = base.resolve()
        folder = (base / out).resolve()  # "." is base; a link, its target
        written = {(folder / name).relative_to(home).as_posix() for name in OUTPUT_FILES}
        for name in OUTPUT_FILES:
            assert (folder / name).read_bytes() == replay_card.reference.files[name], name
        # every entry that was there and is not a card file is as it was (links, bytes, inode) ...
        for rel, entry in before.items():
            if rel not in written:
                assert after.get(rel) == entry, f"{rel} changed"
        # ... and what is new is the card and the folders it was asked to be in (no staging left)
        for rel in set(after) - set(before) - written:
            assert after[rel] == ("folder",) and home / rel in (folder, *folder.parents), f"{rel} was left"
    else:
        status, fragment = expected
        assert code == status, err
        line = error_line(err)
        assert fragment in line, line
        assert str(out).rstrip("/") in line or (str(out).strip() == "" and "--out" in line), line
        assert replay_card.loads == [], "refused only after the model was loaded"
        assert after == before, "a refusal changed the folder"


def test_card_json_stands_only_beside_its_own_set(tmp_path, replay_card, capsys) -> None:
    """An older card replaced with --overwrite: the old card.json goes before any file is
    replaced, so that no mix of old and new files ever stands beside a card.json."""
    import kvasym.atomic as atomic

    out = tmp_path / "card"
    _older_card(out)
    json_there = []  # before each rename of the set
    real_replace = os.replace

    def replace(src, dst):
        json_there.append((out / "card.json").exists())
        real_replace(src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(atomic.os, "replace", replace)
        assert card(out, "--overwrite") == 0
    assert json_there == [False] * len(OUTPUT_FILES)
    assert {n: (out / n).read_bytes() for n in OUTPUT_FILES} == replay_card.reference.files


READ_ONLY_CASES = {
    "the_read_only_folder": lambda b, ro: ro,
    "a_folder_inside_it": lambda b, ro: ro / "sub",
    "a_new_folder_inside_it": lambda b, ro: ro / "new",
    "a_new_nested_folder_inside_it": lambda b, ro: ro / "new" / "deeper",
    "a_link_to_it": lambda b, ro: (os.symlink(ro / "sub", b / "link") or b / "link"),
    "inside_a_link_to_it": lambda b, ro: (os.symlink(ro, b / "link") or b / "link" / "new"),
}


@pytest.mark.parametrize("case", list(READ_ONLY_CASES))
def test_card_into_a_read_only_folder(case, tmp_path, capsys, replay_card) -> None:
    """Root ignores permission bits: a read-only tmpfs is what stops its writes."""
    base = tmp_path / "base"
    base.mkdir()

    def fill(ro: Path) -> None:
        (ro / "sub").mkdir()
        (ro / "sub" / "mine.txt").write_text("mine")

    with tmpfs(base / "ro", "64k", fill, read_only=True) as ro:
        out = READ_ONLY_CASES[case](base, ro)
        before = snapshot(base)
        assert card(out) == 1
        line = error_line(capsys.readouterr().err)
        assert "Read-only file system" in line and str(out) in line, line
        assert replay_card.loads == [], "refused only after the model was loaded"
        assert snapshot(base) == before


# =========================================================================== class 2: killed mid-run

# A subprocess that runs `kvasym ...` and kills itself with SIGKILL at the chosen point
# (HS_KILL "<event>:<k>"): "write" cuts the k-th output file short then dies (as a kill while
# writing it), "rename" dies before the k-th rename, "renamed" right after it, "load" at the
# model's load. Only writes and renames under HS_OUT count (not a codebook cached meanwhile).
# HS_REPLAY replays the card's measurement and page.
DRIVER = r"""
import os, pickle, signal, sys
from pathlib import Path

event, _, nth = os.environ.get("HS_KILL", ":0").partition(":")
nth = int(nth)
count = {"write": 0, "rename": 0, "renamed": 0, "load": 0}

OUT = os.path.abspath(os.environ["HS_OUT"])

def ours(where):
    return isinstance(where, (str, os.PathLike)) and os.path.abspath(os.fspath(where)).startswith(OUT)

def tick(name):
    count[name] += 1
    if name == event and count[name] == nth:
        os.kill(os.getpid(), signal.SIGKILL)

def cut_short(where):
    if not ours(where):
        return
    if event == "write" and count["write"] + 1 == nth:
        raw = Path(where).read_bytes()
        Path(where).write_bytes(raw[: len(raw) // 2])
    tick("write")

# the stages write through pyarrow.parquet.write_table (given a path), the card command through
# DataFrame.to_parquet (which hands pyarrow an open file: counted here, by its path)
import pandas as pd
import pyarrow.parquet as pq
_write_table = pq.write_table
def write_table(table, where, *args, **kwargs):
    _write_table(table, where, *args, **kwargs)
    cut_short(where)
pq.write_table = write_table

_to_parquet = pd.DataFrame.to_parquet
def to_parquet(self, path, *args, **kwargs):
    done = _to_parquet(self, path, *args, **kwargs)
    cut_short(path)
    return done
pd.DataFrame.to_parquet = to_parquet

_write_text = Path.write_text
def write_text(self, *args, **kwargs):
    done = _write_text(self, *args, **kwargs)
    cut_short(self)
    return done
Path.write_text = write_text

_replace = os.replace
def replace(src, dst, *args, **kwargs):
    mine = ours(dst)
    if mine:
        tick("rename")
    _replace(src, dst, *args, **kwargs)
    if mine:
        tick("renamed")
os.replace = replace

from kvasym.real import gguf_model, models
_load = gguf_model.GGUFLlama.load.__func__
def load(cls, path=None, *args, **kwargs):
    tick("load")
    return _load(cls, os.environ["HS_MODEL"], *args, **kwargs)
gguf_model.GGUFLlama.load = classmethod(load)
models.slice_model = lambda slice_, path=None: gguf_model.GGUFLlama.load()
if os.environ.get("HS_REPLAY"):
    import kvasym.real.card as card_module
    import kvasym.render.card_page as page_module
    seen = pickle.loads(Path(os.environ["HS_REPLAY"]).read_bytes())
    card_module.measure_card = lambda *a, **k: seen["measured"]
    page_module.render_card_html = lambda card: seen["html"]

from kvasym.cli import main
sys.exit(main(sys.argv[1:]))
"""


def killed_run(argv: list[str], kill: str, out: Path, replay: Path | None = None) -> subprocess.CompletedProcess:
    from kvasym.dataset import git_commit

    env = {**os.environ, "HS_KILL": kill, "HS_OUT": str(out), "HS_MODEL": str(FIXTURE),
           "KVASYM_GIT_COMMIT": git_commit()}
    if replay is not None:
        env["HS_REPLAY"] = str(replay)
    return subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, env=env,
                          timeout=300)


# 8 files: each cut short while written, a kill before each rename, after the last, at the load;
# every point with an older card in place (--overwrite; the middle ones marked slow), the first and
# last into a new folder
CARD_KILLS = (["load:1"] + [f"write:{k}" for k in range(1, 9)] + [f"rename:{k}" for k in range(1, 9)]
              + ["renamed:8"])


_ENDS = ("load:1", "write:1", "write:8", "rename:1", "rename:8", "renamed:8")


@pytest.mark.parametrize("kill, older", [
    pytest.param(k, True, marks=() if k in (*_ENDS, "write:4", "rename:4") else pytest.mark.slow) for k in CARD_KILLS]
    + [(k, False) for k in _ENDS])
def test_card_killed_then_rerun(kill, older, tmp_path, capsys, replay_card) -> None:
    out = tmp_path / "card"
    extra = []
    if older:
        _older_card(out)
        (out / "notes.txt").write_text("mine")
        extra = ["--overwrite"]
    old = {n: (out / n).read_bytes() for n in OUTPUT_FILES} if older else {}
    new = replay_card.reference.files
    proc = killed_run(["card", str(FIXTURE), "--out", str(out), *CARD_ARGS, *extra], kill, out,
                      replay_card.reference.replay)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    if out.exists():
        present = {p.name for p in out.iterdir()}
        assert not leftovers(out, set(OUTPUT_FILES) | {"notes.txt"}), present
        for name in OUTPUT_FILES:
            if (out / name).exists():
                assert (out / name).read_bytes() in (new[name], old.get(name)), f"{name} is not whole"
        if (out / "card.json").exists():  # the card's index stands only beside its own complete set
            card_json = (out / "card.json").read_bytes()
            own = new if card_json == new["card.json"] else old
            assert all((out / n).read_bytes() == own[n] for n in OUTPUT_FILES), "card.json beside another set"
        if older:
            assert (out / "notes.txt").read_text() == "mine"
    else:
        assert not older
    # the rerun (with --overwrite when a part of a card is in place) writes the reference's bytes
    partial = out.exists() and any((out / n).exists() for n in OUTPUT_FILES)
    assert card(out, *(["--overwrite"] if partial else [])) == 0, capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in OUTPUT_FILES} == new
    if older:
        assert (out / "notes.txt").read_text() == "mine"


STAGE_KILLS = {stage: ["load:1", *(f"{event}:{k}" for k in range(1, len(names) + 1)
                                   for event in ("write", "rename", "renamed"))]
               for stage, (_, names) in STAGES.items()}
_FAST_STAGE_KILLS = {("e2e", "write:1"), ("sensitivity", "write:1"), ("sensitivity", "renamed:1"),
                     ("sensitivity", "write:2")}


@pytest.mark.parametrize("stage, kill", [
    pytest.param(s, k, marks=() if (s, k) in _FAST_STAGE_KILLS else pytest.mark.slow)
    for s, kills in STAGE_KILLS.items() for k in kills])
def test_stage_killed_then_rerun(stage, kill, tmp_path, capsys, stage_reference, tiny_stages) -> None:
    """Each output is written atomically on its own: after the kill a file under its final name
    is the uninterrupted run's bytes or absent (Snakemake marks the job incomplete and reruns it
    whole); the rerun writes the reference's bytes."""
    argv, names = STAGES[stage]
    out = tmp_path / "out"
    out.mkdir()
    proc = killed_run(argv(out), kill, out)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    reference = stage_reference[stage]
    assert not leftovers(out, names)
    for name in names:
        assert not (out / name).exists() or (out / name).read_bytes() == reference[name], f"{name} is not whole"
    assert main(argv(out)) == 0, capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in names} == reference


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.5, 1.5, 2.5, 3.5, 4.5])
def test_card_killed_at_a_moment_then_rerun(delay, tmp_path, capsys, card_reference) -> None:
    """The real measurement (no replay), killed from outside after ``delay`` seconds."""
    import time

    out = tmp_path / "card"
    proc = subprocess.Popen([sys.executable, "-m", "kvasym.cli", "card", str(FIXTURE), "--out", str(out),
                             *CARD_ARGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    if out.exists():
        assert not leftovers(out, set(OUTPUT_FILES))
        if (out / "card.json").exists():
            assert all((out / n).read_bytes() == card_reference.files[n] for n in OUTPUT_FILES)
    partial = out.exists() and any((out / n).exists() for n in OUTPUT_FILES)
    assert main(["card", str(FIXTURE), "--out", str(out), *CARD_ARGS, *(["--overwrite"] if partial else [])]) == 0
    assert {n: (out / n).read_bytes() for n in OUTPUT_FILES} == card_reference.files


# =========================================================================== class 3: a full disk


def _no_space(kind: str) -> OSError:
    """ENOSPC as Python's writes raise it (errno set), or as pyarrow's (a message, no errno)."""
    if kind == "errno":
        return OSError(errno.ENOSPC, ENOSPC)
    return OSError(f"[Errno 28] Error writing bytes to file. Detail: [errno 28] {ENOSPC}")


@pytest.mark.parametrize("victim, kind", [(v, k) for v in OUTPUT_FILES  # pyarrow writes the tables only
                                           for k in (("errno", "pyarrow") if v.endswith(".parquet") else ("errno",))])
def test_card_disk_full_while_writing(victim, kind, tmp_path, monkeypatch, capsys, replay_card) -> None:
    """The disk fills while one file of the card is written (half of it landed): one line naming
    that file, exit 1, no file of the card in place, the older card untouched."""
    import kvasym.atomic as atomic

    real_target = atomic.FileSet.target

    @contextmanager
    def target(self, name):
        with real_target(self, name) as tmp:
            yield tmp
            if name == victim:
                tmp.write_bytes(tmp.read_bytes()[: tmp.stat().st_size // 2])
                raise _no_space(kind)

    monkeypatch.setattr(atomic.FileSet, "target", target)
    out = tmp_path / "card"
    _older_card(out)
    before = snapshot(tmp_path)
    assert card(out, "--overwrite") == 1
    line = error_line(capsys.readouterr().err)
    assert f"{out / victim}: " in line and ENOSPC in line, line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("k", range(1, 9))
def test_card_disk_full_while_renaming(k, tmp_path, monkeypatch, capsys, replay_card) -> None:
    """A rename that fails (ENOSPC on a full directory): the files of the set already renamed are
    removed again, and no card.json stands beside an older card's tables."""
    import kvasym.atomic as atomic

    out = tmp_path / "card"
    _older_card(out)
    (out / "notes.txt").write_text("mine")
    calls = _fail_the_nth_rename(monkeypatch, atomic, k)
    assert card(out, "--overwrite") == 1
    line = error_line(capsys.readouterr().err)
    assert f"{calls[-1]}: {ENOSPC}" in line, line
    assert not (out / "card.json").exists()
    for name in OUTPUT_FILES[1:]:  # the older card's files not yet replaced are there whole; no new one
        assert not (out / name).exists() or (out / name).read_bytes() == f"an older card's {name}".encode()
    assert (out / "notes.txt").read_text() == "mine" and not leftovers(out, set(OUTPUT_FILES) | {"notes.txt"})
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "the staging folder is left"


@pytest.mark.parametrize("pages", [1, 3, 6, 10, 16, 24, 40, 56])
def test_card_on_a_full_tmpfs(pages, tmp_path, capsys, replay_card) -> None:
    """A real full disk: the card written to a tmpfs of a few 4 KiB pages (the card needs ~70)."""
    base = tmp_path / "base"
    base.mkdir()
    with tmpfs(base / "full", f"{4 * pages}k") as full:
        (full / "mine.txt").write_text("mine")
        out = full / "card"
        before = snapshot(base)
        assert card(out) == 1
        line = error_line(capsys.readouterr().err)
        assert ENOSPC in line and str(out) in line, line
        assert snapshot(base) == before, "the folder it made, or a file, was left"


@pytest.mark.parametrize("kind", ["errno", "pyarrow"])
@pytest.mark.parametrize("stage, victim", [(stage, k) for stage, (_, names) in STAGES.items()
                                           for k in range(1, len(names) + 1)])
def test_stage_disk_full_while_writing(stage, victim, kind, tmp_path, monkeypatch, capsys, stage_reference,
                                       tiny_stages) -> None:
    import pyarrow.parquet as pq

    argv, names = STAGES[stage]
    real_write, calls = pq.write_table, []

    def write_table(table, where, *args, **kwargs):
        calls.append(where)
        real_write(table, where, *args, **kwargs)
        if len(calls) == victim:
            Path(where).write_bytes(Path(where).read_bytes()[:100])
            raise _no_space(kind)

    monkeypatch.setattr(pq, "write_table", write_table)
    out = tmp_path / "out"
    assert main(argv(out)) == 1
    line = error_line(capsys.readouterr().err)
    failed = names[victim - 1]
    assert f"{out / failed}: " in line and ENOSPC in line, line
    assert not (out / failed).exists() and not leftovers(out, names) and not list(out.glob(".*"))
    for name in names[: victim - 1]:  # written before the disk filled: whole
        assert (out / name).read_bytes() == stage_reference[stage][name]


@pytest.mark.parametrize("stage, victim", [(stage, k) for stage, (_, names) in STAGES.items()
                                           for k in range(1, len(names) + 1)])
def test_stage_disk_full_while_renaming(stage, victim, tmp_path, monkeypatch, capsys, tiny_stages) -> None:
    import kvasym.atomic as atomic

    argv, names = STAGES[stage]
    _fail_the_nth_rename(monkeypatch, atomic, victim)
    out = tmp_path / "out"
    assert main(argv(out)) == 1
    line = error_line(capsys.readouterr().err)
    assert f"{out / names[victim - 1]}: {ENOSPC}" in line, line
    assert not (out / names[victim - 1]).exists() and not list(out.glob(".*"))


@pytest.mark.parametrize("stage, pages", [("e2e", 1), ("e2e", 2), ("sensitivity", 1)]
                         + ([("sensitivity", 3)] if len(SENSITIVITY_OUTPUTS) == 2 else []))
def test_stage_on_a_full_tmpfs(stage, pages, tmp_path, capsys, stage_reference, tiny_stages) -> None:
    argv, names = STAGES[stage]
    with tmpfs(tmp_path / "full", f"{4 * pages}k") as full:
        assert main(argv(full)) == 1
        line = error_line(capsys.readouterr().err)
        assert ENOSPC in line and any(f"{full / name}: " in line for name in names), line
        for name in names:
            assert not (full / name).exists() or (full / name).read_bytes() == stage_reference[stage][name]
        assert not list(full.glob(".*")), "a temporary file was left"


# =========================================================================== class 4: the crate

CRATE_SLICE = {"inputs": {"config": "config/c.yaml", "claims_file": "config/claims.yaml"}, "config_sha256": "ab" * 32,
               "unit_writers": {"gaussian": "cells", "t3": "cells"}}
LEDGER = [{"id": "C1", "statistic": "kl_ratio", "statement": "KQV beats QKQV", "estimate": 2.0, "verdict": "holds",
           "where": {"distribution": "gaussian", "dim": 64}}]
# the run's outputs, as --files targets; a unit folder (written whole, with its marker) among them
UNIT = "results/metrics/per_query/gaussian/d64"
TARGETS = [UNIT, "results/stats/comparisons/gaussian/d64.parquet", "results/stats/comparisons/t3/d64.parquet",
           "results/stats/comparisons.parquet", "results/data/gaussian/d64.json", "results/figures/f.png",
           "results/figures/f.pdf", "paper/generated/numbers.tex", "results/claims/claims.json"]
FILES = [f"{UNIT}/KV/n2.parquet", f"{UNIT}/KQV/n2.parquet", *TARGETS[1:]]


def _table(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"value": [value] * 3, "x": [1.0, 2.0, 3.0]}).to_parquet(path, index=False)


def small_run(root: Path) -> Path:
    """A folder laid out as a finished run: every TARGETS file whole of its format."""
    from kvasym.atomic import FOLDER_MARKER

    for rel in ("Snakefile", "config/c.yaml", "config/claims.yaml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"content of {rel}\n")
    for rel in FILES:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix == ".parquet":
            _table(p, rel)
        elif p.suffix == ".json":
            p.write_text(json.dumps(LEDGER if "claims" in rel else {"trials": 2}))
        elif p.suffix == ".png":
            p.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 30 + b"\0\0\0\0IEND\xaeB`\x82")
        elif p.suffix == ".pdf":
            p.write_bytes(b"%PDF-1.5\n% a figure\n%%EOF\n")
        else:
            p.write_text("\\newcommand{\\x}{1}\n")
    (root / UNIT / FOLDER_MARKER).write_text("written whole\n")
    return root


def crate(root: Path, targets=TARGETS, claims: str = "results/claims/claims.json", slice_=None) -> int:
    return main(["stage", "crate", "--slice", json.dumps(slice_ or CRATE_SLICE), "--claims", claims,
                 "--files", *map(str, targets), "--root", str(root), "--out", str(root / "ro-crate-metadata.json")])


def check_listing(root: Path) -> set[str]:
    """The crate's File entities: each there, with its true size and SHA-256; their ids."""
    graph = json.loads((root / "ro-crate-metadata.json").read_text())["@graph"]
    files = {}
    for entity in graph:
        if entity["@type"] == "File":
            data = (root / entity["@id"]).read_bytes()
            assert entity["sha256"] == hashlib.sha256(data).hexdigest() and int(entity["contentSize"]) == len(data)
            files[entity["@id"]] = entity
    return set(files)


@pytest.fixture
def run_root(tmp_path, monkeypatch):
    root = small_run(tmp_path / "run")
    monkeypatch.chdir(root)
    return root


def test_crate_of_the_whole_run(run_root, capsys) -> None:
    assert crate(run_root) == 0, capsys.readouterr().err
    assert check_listing(run_root) == {*FILES, "config/c.yaml", "config/claims.yaml"}


@pytest.mark.parametrize("missing", [*TARGETS, UNIT + "/KV"])
def test_crate_refuses_a_missing_output(missing, run_root, capsys) -> None:
    import shutil

    p = run_root / missing
    shutil.rmtree(p) if p.is_dir() else p.unlink()
    targets = TARGETS if missing in TARGETS else [*TARGETS, missing]
    ledger = missing.endswith("claims.json")  # read first, as the stage's input: an OS error, exit 1
    assert crate(run_root, targets) == (1 if ledger else 2)
    line = error_line(capsys.readouterr().err)
    assert f"{missing}: " + ("No such file or directory" if ledger else "no such file or folder") in line, line
    assert not (run_root / "ro-crate-metadata.json").exists()


_CUTS = {"empty": lambda raw: b"", "half": lambda raw: raw[: len(raw) // 2], "one_byte_short": lambda raw: raw[:-1],
         "head_only": lambda raw: raw[:8], "garbage_appended": lambda raw: raw + b"\n"}
_DAMAGEABLE = [f for f in FILES if Path(f).suffix in (".parquet", ".json", ".png", ".pdf")]


# a newline more (JSON, PDF) or less (PDF) after the end still makes a whole file: not a case
_WHOLE_ANYWAY = {("garbage_appended", ".json"), ("garbage_appended", ".pdf"), ("one_byte_short", ".pdf")}


@pytest.mark.parametrize("rel, cut", [(rel, cut) for rel in _DAMAGEABLE for cut in _CUTS
                                      if (cut, Path(rel).suffix) not in _WHOLE_ANYWAY])
def test_crate_refuses_an_output_cut_short(rel, cut, run_root, capsys) -> None:
    """A file emptied or cut short after its job ended is refused, named, and (being in results/)
    moved aside so that the next run rebuilds it; a whole unit folder goes aside for a file in it."""
    p = run_root / rel
    damaged = _CUTS[cut](p.read_bytes())
    p.write_bytes(damaged)
    assert crate(run_root) == 2
    line = error_line(capsys.readouterr().err)
    assert f"{rel}: " in line, line
    assert not (run_root / "ro-crate-metadata.json").exists()
    aside = run_root / UNIT if rel.startswith(UNIT) else p
    moved = aside.with_name(f".{aside.name}.damaged")
    assert "moved aside" in line and not aside.exists() and moved.exists(), line
    assert (moved / p.relative_to(aside) if aside != p else moved).read_bytes() == damaged


def test_crate_leaves_a_damaged_file_outside_results_alone(run_root, capsys) -> None:
    (run_root / "extra").mkdir()
    (run_root / "extra" / "mine.json").write_text('{"cut')
    assert crate(run_root, [*TARGETS, "extra/mine.json"]) == 2
    line = error_line(capsys.readouterr().err)
    assert "extra/mine.json: not valid JSON" in line and "it is yours" in line, line
    assert (run_root / "extra" / "mine.json").read_text() == '{"cut'


LEDGERS = {"not_json": "{not", "empty": "", "an_object": "{}", "null": "null", "a_string": '"claims"',
           "numbers": "[1, 2]", "no_id": '[{"statement": "x"}]', "id_true": '[{"id": true}]',
           "id_a_list": '[{"id": ["C1"]}]', "where_a_list": '[{"id": "C1", "where": [64]}]',
           "where_a_string": '[{"id": "C1", "where": "gaussian"}]', "latin1": b"[{\"id\": \"\xe9\"}]"}


@pytest.mark.parametrize("ledger", list(LEDGERS))
def test_crate_refuses_a_damaged_ledger(ledger, run_root, capsys) -> None:
    path = run_root / "results/claims/claims.json"
    text = LEDGERS[ledger]
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert crate(run_root) == 2
    line = error_line(capsys.readouterr().err)
    assert "results/claims/claims.json: " in line and "claims ledger" in line, line
    assert not (run_root / "ro-crate-metadata.json").exists()


def test_crate_accepts_an_empty_ledger(run_root, capsys) -> None:
    (run_root / "results/claims/claims.json").write_text("[]")
    assert crate(run_root) == 0, capsys.readouterr().err


def _outside(root: Path) -> Path:
    other = root.parent / "elsewhere"
    other.mkdir(exist_ok=True)
    _table(other / "t.parquet", "outside")
    return other


PATH_CASES = {
    "target_absolute_outside": (lambda r: [*TARGETS, str(_outside(r) / "t.parquet")], {},
                                (2, "lies outside the crate's root")),
    "target_dotdot_outside": (lambda r: [*TARGETS, "../elsewhere/t.parquet"] if _outside(r) else [], {},
                              (2, "lies outside the crate's root")),
    "target_a_fifo": (lambda r: (os.mkfifo(r / "results/fifo") or [*TARGETS, "results/fifo"]), {},
                      (2, "results/fifo: not a regular file or folder")),
    "target_a_dangling_link": (lambda r: (os.symlink(r / "nowhere", r / "results/l.parquet")
                                          or [*TARGETS, "results/l.parquet"]), {},
                               (2, "results/l.parquet: a symbolic link that leads to no file")),
    "dangling_link_in_a_folder": (lambda r: (os.symlink(r / "nowhere", r / UNIT / "KV" / "n4.parquet") or TARGETS), {},
                                  (2, "n4.parquet: a symbolic link to no file")),
    "config_outside_root": (lambda r: TARGETS, {"inputs": {"config": "../elsewhere/c.yaml",
                                                           "claims_file": "config/claims.yaml"}},
                            (2, "the run's config lies outside the crate's root")),
    "config_missing": (lambda r: TARGETS, {"inputs": {"config": "config/none.yaml",
                                                      "claims_file": "config/claims.yaml"}},
                       (2, "config/none.yaml: no such file")),
    # written: the crate lists what is there, under the names the run gave
    "link_in_a_folder_to_a_table_outside": (
        lambda r: (os.symlink(_outside(r) / "t.parquet", r / UNIT / "KV" / "n4.parquet") or TARGETS), {},
        {f"{UNIT}/KV/n4.parquet"}),
    "results_a_link_to_a_scratch_disk": (
        lambda r: (os.rename(r / "results", r.parent / "scratch") or os.symlink(r.parent / "scratch", r / "results")
                   or TARGETS), {}, set()),
    "target_given_with_dots": (lambda r: [*TARGETS, "results/stats/../stats/comparisons.parquet"], {}, set()),
    "stale_hidden_temporary_in_a_folder": (
        lambda r: (put(r / UNIT / "KV" / ".n2.parquet.x1y2.tmp", b"PAR1 cut") or TARGETS), {}, set()),
    "stale_moved_aside_folder": (
        lambda r: ((r / UNIT / ".KV.damaged").mkdir() or put(r / UNIT / ".KV.damaged" / "n2.parquet", b"")
                   or TARGETS), {}, set()),
    "stale_extra_table_in_a_unit_folder": (lambda r: (_table(r / UNIT / "RKV" / "n9.parquet", "stale") or TARGETS),
                                           {}, {f"{UNIT}/RKV/n9.parquet"}),
    "an_older_crate_in_place": (
        lambda r: (put(r / "ro-crate-metadata.json", '{"older": true}') or TARGETS), {}, set()),
}


@pytest.mark.parametrize("case", list(PATH_CASES))
def test_crate_paths(case, run_root, capsys) -> None:
    setup, slice_change, expected = PATH_CASES[case]
    (run_root.parent / "elsewhere").mkdir(exist_ok=True)
    (run_root.parent / "elsewhere" / "c.yaml").write_text("outside\n")
    targets = setup(run_root)
    before = snapshot(run_root.parent)
    code = crate(run_root, targets, slice_={**CRATE_SLICE, **slice_change})
    err = capsys.readouterr().err
    if isinstance(expected, tuple):
        status, fragment = expected
        assert code == status, err
        assert fragment in error_line(err)
        assert snapshot(run_root.parent) == before, "a refusal changed a file"
    else:
        assert code == 0, err
        assert check_listing(run_root) == {*FILES, "config/c.yaml", "config/claims.yaml", *expected}


def test_crate_disk_full(run_root, monkeypatch, capsys) -> None:
    import kvasym.atomic as atomic

    (run_root / "ro-crate-metadata.json").write_text('{"older": true}')
    real_write = Path.write_text

    def write_text(self, text, *args, **kwargs):
        if self.name.startswith(".ro-crate-metadata.json."):
            real_write(self, text[: len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, ENOSPC)
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(atomic.Path, "write_text", write_text)
    assert crate(run_root) == 1
    line = error_line(capsys.readouterr().err)
    assert f"{run_root / 'ro-crate-metadata.json'}: {ENOSPC}" in line, line
    assert (run_root / "ro-crate-metadata.json").read_text() == '{"older": true}'
    assert not [p for p in run_root.iterdir() if p.name.startswith(".ro-crate")]
