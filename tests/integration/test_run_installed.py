"""`diag run` on a job with its own sitecustomize (issue 9.6), from diag installed as a wheel in its own
venv, run from the job's directory. A launch script that prepends the job's directory to PYTHONPATH
used to make the job's sitecustomize shadow diag's: exit 0, no trace, no warning. The job's
sitecustomize (and the module it imports from the job's directory) must still run, and the agent too.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.integration.installed import clean_env, run

pytestmark = pytest.mark.slow

SITE = "import jobshim\njobshim.mark()\n"
SHIM = "import os\n\ndef mark():\n    os.environ['JOB_SHIM_RAN'] = str(os.getpid())\n"
TRAIN = """import os, torch
assert os.environ.get('JOB_SHIM_RAN') == str(os.getpid()), "the job's sitecustomize did not run"
m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3): m(torch.ones(1, 2)).sum().backward(); o.step()
print('trained', flush=True)
"""
LAUNCH = {  # how the job's own launcher sets PYTHONPATH before it starts python
    "job_dir_later": "exec python train.py\n",
    "job_dir_first": "export PYTHONPATH=$PWD:$PYTHONPATH\nexec python train.py\n",
    "replaced": "export PYTHONPATH=$PWD\nexec python train.py\n",
}


@pytest.mark.parametrize("launch", sorted(LAUNCH))
def test_run_keeps_the_jobs_sitecustomize_and_starts_the_agent(venv, tmp_path, launch):
    job = tmp_path / "job"
    job.mkdir()
    for name, text in {
        "sitecustomize.py": SITE,
        "jobshim.py": SHIM,
        "train.py": TRAIN,
        "launch.sh": LAUNCH[launch],
    }.items():
        (job / name).write_text(text)
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    bin_dir = os.path.dirname(venv["python"])
    env = clean_env(
        XDG_RUNTIME_DIR=str(xdg), PYTHONPATH=str(job), PATH=bin_dir + os.pathsep + os.environ.get("PATH", "")
    )
    trace = tmp_path / "trace"
    res = run(
        venv["diag"],
        "run",
        "--what",
        "steps",
        "--trace-dir",
        str(trace),
        "--",
        "bash",
        "launch.sh",
        cwd=str(job),
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "trained" in res.stdout and "diag:" not in res.stderr, res.stderr
    assert trace.is_dir(), f"no trace: the agent never started ({launch})"
    (name,) = os.listdir(trace)
    with open(trace / name) as f:
        kinds = [json.loads(line)["k"] for line in f]
    assert kinds.count("step") == 3, kinds


def test_the_hook_is_installed_beside_diag(venv):
    """The wheel puts diag-run.pth at the root of site-packages, where Python runs it at start-up."""
    with open(os.path.join(venv["purelib"], "diag-run.pth")) as f:
        assert "diag.inject.site.hook" in f.read()
    probe = "import sys; print([type(f).__name__ for f in sys.meta_path])"
    quiet = subprocess.run(
        [venv["python"], "-c", probe], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    assert "_Finder" not in quiet.stdout, "armed without DIAG_RUN"
