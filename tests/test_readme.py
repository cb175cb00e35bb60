"""Every command the README shows is run here, or by something this file checks runs it (CI,
the docs build, scripts/check_wheel), so the README cannot drift from the code. The README
stays short and says what is true now: no run numbers, commit ids or history."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import shadowsync
from tests.helpers import require_movielens, run_cli, run_python

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# Run by CI itself (.ci/run is scripts/test, which runs scripts/setup first).
BY_CI = {"scripts/setup && .venv/bin/shadowsync train", "scripts/test"}
# Run elsewhere: the command, and a (file, text) pair that shows where.
ELSEWHERE = {
    ".venv/bin/mkdocs build --strict": ("tests/test_docs.py", '"mkdocs", "build", "--strict"'),
    "pip install -e .": ("scripts/setup", 'pip_install -e ".['),
    "python -m build --wheel": ("scripts/check_wheel", "-m build --wheel"),
    f"pip install dist/shadowsync-{shadowsync.__version__}-py3-none-any.whl":
        ("scripts/check_wheel", "pip install \"$wheel\""),
}
# Run as written here, in order, in one directory (later ones use what earlier ones made).
RUN = [
    ".venv/bin/shadowsync --version",
    ".venv/bin/shadowsync train --help",
    ".venv/bin/shadowsync train --trainers 3 --sync s-easgd --print-config > job.toml",
    ".venv/bin/shadowsync data synth --out data/ --examples 40000",
    ".venv/bin/shadowsync train --data data/train.tsv --eval-data data/eval.tsv --out runs/tsv",
    ".venv/bin/shadowsync train --examples 100000 --checkpoint-every 40000 --out runs/ckpt",
    ".venv/bin/shadowsync eval --checkpoint runs/ckpt --data synthetic",
    ".venv/bin/shadowsync export --checkpoint runs/ckpt --out model.pt2",
]
# The real-data path, run as written by its own test (it fetches MovieLens 100K once).
REAL_DATA = [
    ".venv/bin/shadowsync data prepare movielens100k --out ml",
    ".venv/bin/shadowsync train --data ml/train.parquet --eval-data ml/eval.parquet "
    "--schema ml/schema.toml --epochs 20 --val-share 0.1 --out runs/ml",
    ".venv/bin/shadowsync eval --checkpoint runs/ml --data ml/eval.parquet",
]


def readme_commands() -> list[str]:
    """The commands of the README's bash blocks: continuation lines joined, comments cut."""
    text = README.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(" ".join(command.split()))
    return commands


def readme_python() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


# What a command run without a shell could not mean as a shell means it.
SHELL_SYNTAX = re.compile(r"[|&;<>$`()*?\[\]{}~]")


def _run_as_written(command: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """A README command, `.venv/bin/shadowsync ARGS` with at most `> FILE` after it, run as
    a shell in `cwd` runs it: its words split as the shell splits them, this checkout's CLI
    run on them (forked by the tests' CLI server: a fresh `python -m shadowsync.cli` but for
    the interpreter's start-up), its output written to FILE."""
    words, redirect, target = command.partition(" > ")
    program, *args = shlex.split(words)
    assert program == ".venv/bin/shadowsync", command
    assert not SHELL_SYNTAX.search(words + target), f"needs a shell: {command}"
    res = run_cli(args, timeout, cwd=cwd)
    if redirect:
        (cwd / target.strip()).write_text(res.stdout)
    return res


def _train_checked(command: str) -> str:
    """A train command that would run a whole job, made to check every option and exit."""
    head, redirect, tail = command.partition(" > ")
    return head + " --print-config" + (redirect + tail if redirect else " > /dev/null")


def test_readme_is_short_and_undated():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    commit_id = r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"
    for pattern in (r"\bruns? \d+\b", commit_id, r"\bbefore/after\b", r"at this version",
                    r"\b20\d\d-\d\d-\d\d\b", r"git worktree"):
        assert not re.search(pattern, text, re.I), pattern


def test_every_readme_command_is_classified():
    """A new command in the README must be added to one of the lists above, so it is run."""
    commands = readme_commands()
    assert commands[:2] == ["scripts/setup && .venv/bin/shadowsync train", "scripts/test"]
    for command in commands:
        if command in BY_CI or command in RUN or command in ELSEWHERE or command in REAL_DATA:
            continue
        if command.startswith(".venv/bin/shadowsync train "):  # checked, not trained
            continue
        if command.startswith("torchrun "):
            continue
        raise AssertionError(f"README command not run by any test: {command}")
    assert set(RUN) <= set(commands), "RUN lists a command the README no longer shows"
    assert set(REAL_DATA) <= set(commands), "REAL_DATA lists a command the README lost"


def test_commands_run_elsewhere_are_run_there():
    commands = readme_commands()
    for command, (path, text) in ELSEWHERE.items():
        assert command in commands, f"{command} is no longer in the README"
        assert text in (ROOT / path).read_text(encoding="utf-8"), (command, path)


def test_sync_and_option_examples_are_valid(tmp_path: Path):
    """The train commands that would train a whole job: every option checked (by
    --print-config, which builds the configuration and exits)."""
    (tmp_path / "job.toml").write_text("trainers = 3\n")
    checked = [c for c in readme_commands()
               if c.startswith(".venv/bin/shadowsync train ") and c not in RUN + REAL_DATA]
    assert len(checked) >= 5
    for command in checked:
        res = _run_as_written(_train_checked(command), tmp_path, timeout=120)
        assert res.returncode == 0, (command, res.stderr)


def test_torchrun_command_parses(tmp_path: Path):
    """torchrun's own options parse, and shadowsync.run takes the rest (it stops with its
    one line because no torchrun started it)."""
    from torch.distributed.run import get_args_parser

    (command,) = [c for c in readme_commands() if c.startswith("torchrun ")]
    argv = shlex.split(command)[1:]
    args = get_args_parser().parse_args(argv)
    assert args.nnodes == "3" and args.module and args.training_script == "shadowsync.run"
    (tmp_path / "job.toml").write_text("embedding_servers = 1\ntrainers = 2\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    res = subprocess.run([sys.executable, "-m", "shadowsync.run", *args.training_script_args],
                         cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "is started by torchrun" in res.stderr, res.stderr


@pytest.mark.timeout(420)
def test_readme_commands_run_as_written(tmp_path: Path):
    outputs = {}
    for command in RUN:
        res = _run_as_written(command, tmp_path, timeout=240)
        assert res.returncode == 0, (command, res.stderr[-3000:])
        outputs[command] = res.stdout
    assert outputs[RUN[0]].strip() == f"shadowsync {shadowsync.__version__}"
    assert "synchronization:" in outputs[RUN[1]]
    assert "trainers = 3" in (tmp_path / "job.toml").read_text()
    assert "eval_ne" in outputs[RUN[4]] and "ne_vs_teacher" in outputs[RUN[4]]  # teacher.json
    assert (tmp_path / "runs" / "ckpt" / "summary.json").exists()
    assert re.search(r"^\s+ne\s+0\.\d+", outputs[RUN[-2]], re.M)
    assert (tmp_path / "model.pt2").stat().st_size > 0
    assert "table_width" in (tmp_path / "model.pt2.schema.json").read_text()


@pytest.mark.timeout(200)
def test_readme_python_runs(tmp_path: Path):
    """The README's Python block, as written, next to examples/my_model.py and arrays."""
    (block,) = readme_python()
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from own_arrays import write_arrays
    finally:
        sys.path.pop(0)
    write_arrays(str(tmp_path / "my_arrays"), 12_000)
    (tmp_path / "my_model.py").write_text((ROOT / "examples" / "my_model.py").read_text())
    script = "if __name__ == '__main__':\n" + textwrap.indent(block, "    ")
    (tmp_path / "readme_block.py").write_text(script)
    res = run_python(["readme_block.py"], timeout=170, cwd=tmp_path,
                     env={"PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    first, *predicted = res.stdout.splitlines()
    eval_ne, out, checkpoint = first.split()
    assert 0 < float(eval_ne) < 1 and out == "runs/mine" and "checkpoint/step-" in checkpoint
    probs = [float(x) for x in " ".join(predicted).strip("tensor([])").replace(",", " ").split()]
    assert len(probs) == 4 and all(0 < p < 1 for p in probs)


@pytest.mark.timeout(420)
def test_readme_real_data_path_runs_as_written(tmp_path: Path):
    """prepare, train with epochs and the best model, eval: the commands as the README shows
    them, and the summary says which epoch was best."""
    require_movielens()
    outputs = []
    for command in REAL_DATA:
        res = _run_as_written(command, tmp_path, timeout=300)
        assert res.returncode == 0, (command, res.stderr[-3000:])
        outputs.append(res.stdout)
    summary = json.loads((tmp_path / "runs" / "ml" / "summary.json").read_text())
    assert (tmp_path / "runs" / "ml" / "checkpoint" / "best").is_dir()
    assert summary["best"] and summary["eval_auc"] > 0.7
    auc = re.search(r"^\s+auc\s+(0\.\d+)", outputs[-1], re.M)
    assert auc and abs(float(auc.group(1)) - summary["eval_auc"]) <= 5e-5  # printed to 4 places
