"""``install.py --provide-sageattention`` / ``--remove-sageattention`` (``installer/dropin.py``), run by
throwaway venvs' Pythons (they see this Python's packages read-only; nothing lands in the test venv)."""
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import venv_seeing_this_python
from sagetriton_import import PACK_DIR


def run(python, *args, env=None, check=False):
    proc = subprocess.run([str(python), *args], capture_output=True, text=True, cwd=str(PACK_DIR), timeout=300,
                          env={**os.environ, **(env or {})})
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def site_of(python) -> Path:
    return Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", check=True)
                .stdout.strip())


def install(python, *flags, env=None):
    return run(python, str(PACK_DIR / "install.py"), *flags, env=env)


PROBE = """
import importlib.metadata, inspect, sageattention
from packaging.version import Version
from diffusers.utils.import_utils import is_sageattention_available, is_sageattention_version
version = importlib.metadata.version("sageattention")
print(version, Version(version) >= Version("2.1.1"),
      is_sageattention_available(), is_sageattention_version(">=", "2.1.1"),
      "attn_mask" in inspect.signature(sageattention.sageattn).parameters, sageattention.__file__)
"""


def test_provide_then_remove_in_a_throwaway_venv(tmp_path):
    if importlib.util.find_spec("diffusers") is None:  # not imported here: see test_engines.needs
        pytest.skip("diffusers is not installed (.ci/run installs it into the pinned leg)")
    python = venv_seeing_this_python(tmp_path / "venv")
    site = site_of(python)
    assert run(python, "-c", "import sageattention").returncode != 0
    proc = install(python, "--provide-sageattention")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "installed sageattention 2.2.0+sagetriton" in proc.stdout
    fields = run(python, "-c", PROBE, check=True).stdout.split()
    assert fields[:5] == ["2.2.0+sagetriton", "True", "True", "True", "True"], fields
    assert Path(fields[5]).is_relative_to(site)
    again = install(python, "--provide-sageattention")
    assert again.returncode == 0 and "already installed" in again.stdout
    gone = install(python, "--remove-sageattention")
    assert gone.returncode == 0 and "removed" in gone.stdout, gone.stdout + gone.stderr
    assert run(python, "-c", "import sageattention").returncode != 0
    assert not [p for p in site.iterdir() if "sageattention" in p.name.lower() or p.name.startswith(".sagetriton")]
    # An ordinary distribution: pip uninstalls it too (its RECORD lists every file).
    install(python, "--provide-sageattention")
    pip = run(python, "-m", "pip", "uninstall", "-y", "sageattention")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert not (site / "sageattention").exists() and not list(site.glob("sageattention-*"))


def _fake_sageattention(site: Path, with_dist: bool) -> dict:
    pkg = site / "sageattention"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("def sageattn(*a, **k):\n    raise RuntimeError('the CUDA one')\n")
    if with_dist:
        dist = site / "sageattention-2.2.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sageattention\nVersion: 2.2.0\n")
        (dist / "RECORD").write_text("sageattention/__init__.py,,\n")
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in site.rglob("*") if p.is_file()
            and "sageattention" in str(p.relative_to(site))}


@pytest.mark.parametrize("with_dist", [True, False], ids=["installed SageAttention", "a module on the path"])
def test_never_over_or_in_front_of_another_sageattention(tmp_path, with_dist):
    python = venv_seeing_this_python(tmp_path / "venv")
    if with_dist:  # pip-installed into this very site-packages
        site = site_of(python)
        env = None
    else:  # a source checkout on PYTHONPATH, no distribution
        site = tmp_path / "checkout"
        env = {"PYTHONPATH": str(site)}
    before = _fake_sageattention(site, with_dist)
    proc = install(python, "--provide-sageattention", env=env)
    assert proc.returncode == 1
    expected = "SageAttention 2.2.0" if with_dist else f"a sageattention module at {site / 'sageattention'}"
    assert expected in proc.stderr and "not installed" in proc.stderr, proc.stderr
    removed = install(python, "--remove-sageattention", env=env)
    assert removed.returncode == 1 and "left as it is" in removed.stderr, removed.stderr
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in site.rglob("*") if p.is_file()
             and "sageattention" in str(p.relative_to(site))}
    assert after == before  # nothing written over, nothing removed
    assert not list(site_of(python).glob("*sagetriton*"))


def test_the_drop_in_says_so_when_its_pack_is_gone(tmp_path, pack):
    """An ImportError named ``sageattention`` (what ComfyUI and diffusers catch), saying what to do."""
    from sagetriton.installer import dropin

    target = tmp_path / "site"
    ok, message = dropin.install(target, pack_dir=tmp_path / "moved-away")
    assert ok, message
    proc = subprocess.run([sys.executable, "-c", "import sageattention"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(target)}, timeout=120)
    assert proc.returncode != 0
    assert "ImportError: sageattention (SageTriton's drop-in): the pack it was installed from is gone" in proc.stderr
    assert dropin.remove(target)[0] and not list(target.iterdir())


def test_a_package_put_over_the_drop_in_is_not_removed(tmp_path, pack):
    from sagetriton.installer import dropin

    target = tmp_path / "site"
    assert dropin.install(target)[0]
    (target / "sageattention" / "__init__.py").write_text("# someone else's\n")
    assert dropin.remove(target)[0]
    assert (target / "sageattention" / "__init__.py").read_text() == "# someone else's\n"
    assert not list(target.glob("*.dist-info"))
