"""The README's "Running as a service" steps, run as written up to `systemd-analyze verify`, with
the machine's folders (/opt, /usr/local/bin, /etc, /var/lib, /data) moved under a scratch folder
and `sudo` left out.

The test stands the current environment's `streamer` in for the install step (pip would fetch
packages); `python tests/test_readme_service.py [FOLDER]` runs that step too, as a new user would.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"
MOVED = re.compile(r"(/opt/streamer|/usr/local/bin|/etc/|/var/lib/streamer|/data/)")
INSTALL = ("sudo python3 -m venv /opt/streamer", "sudo /opt/streamer/bin/pip install '.[gpu]'")


def steps(readme: str = (ROOT / "README.md").read_text()) -> list[str]:
    """The section's shell commands (continued lines joined), up to `systemd-analyze verify`."""
    section = readme.split("## Running as a service", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [re.sub(r"\s+#.*$", "", c).strip() for c in block.replace("\\\n", " ").splitlines()]
    commands = [c for c in commands if c]
    last = next(i for i, c in enumerate(commands) if "systemd-analyze verify" in c)
    return commands[: last + 1]


def run_steps(root: Path, *, install: bool) -> list[subprocess.CompletedProcess]:
    """Each step in `root` as `/`; without `install`, the current `streamer` stands in for the install."""
    for there in ("usr/local/bin", "etc/systemd/system"):  # on any machine with systemd
        (root / there).mkdir(parents=True, exist_ok=True)
    (root / "data/FAK12345").mkdir(parents=True, exist_ok=True)  # the run folder the file names
    (root / "data/ref").mkdir(parents=True, exist_ok=True)
    shutil.copy(REFERENCE, root / "data/ref/genome.fa.gz")
    env = {"PATH": f"{root}/usr/local/bin:/usr/bin:/bin", "HOME": str(root)}
    done = []
    for step in steps():
        if not install and step in INSTALL:
            if step == INSTALL[1]:
                (root / "opt/streamer/bin").mkdir(parents=True)
                (root / "opt/streamer/bin/streamer").symlink_to(Path(sys.executable).with_name("streamer"))
            continue
        command = MOVED.sub(lambda m: f"{root}{m.group(1)}", step.replace("sudo ", ""))
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=1800)  # fmt: skip
        assert res.returncode == 0, f"{step}\n{res.stdout}{res.stderr}"
        done.append(res)
        if step.startswith("sudo install -m 644 systemd/"):  # installed as shipped; here /opt is under root
            for unit in (root / "etc/systemd/system").glob("streamer*.service"):
                unit.write_text(unit.read_text().replace("/opt/streamer/", f"{root}/opt/streamer/"))
    return done


def test_the_documented_install_path_and_extra():
    commands = steps()
    assert commands[:2] == list(INSTALL)
    unit = (ROOT / "systemd/streamer.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    check = next(c for c in commands if "validate-config" in c)
    # the unit's flags, so the check is of what the service runs
    assert "--output /var/lib/streamer/output --state-dir /var/lib/streamer/state" in check
    assert "--output %S/streamer/output --state-dir %S/streamer/state" in exec_start
    assert exec_start.startswith("ExecStart=/opt/streamer/bin/streamer run --config /etc/streamer/streamer.yaml")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_readme_steps_run_up_to_systemd_analyze_verify(tmp_path):
    done = run_steps(tmp_path, install=False)
    assert any(r.stdout.strip().endswith("streamer.yaml: ok") for r in done)
    config = (tmp_path / "etc/streamer/streamer.yaml").read_text()
    assert "follow: true" in config and f"{tmp_path}/data/FAK12345" in config
    assert (tmp_path / "etc/systemd/system/streamer@.service").is_file()
    assert not (tmp_path / "var/lib/streamer").exists()  # validate-config writes nothing


if __name__ == "__main__":
    where = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/streamer-readme-service")
    shutil.rmtree(where, ignore_errors=True)
    for r in run_steps(where, install=True):
        print(r.args[-1], r.stdout, r.stderr, sep="\n")
    print(f"every step up to systemd-analyze verify passed in {where}")
